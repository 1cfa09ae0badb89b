"""The general HF tokenizer.json pipeline: added tokens, normalizer, pre-tokenizer, model.

Used for every tokenizer.json that is not plain byte-level BPE (which `ByteLevelBPETokenizer`
runs faster): WordPiece (BERT), BPE over Metaspace pieces with byte fallback (Llama/Mistral
style), Unigram, and any mix of the normalizers and pre-tokenizers `tokenizers` offers.
The order is that of `tokenizers`: added tokens that are not `normalized` are found in the
raw text; each remaining chunk is normalized on its own and searched for the `normalized`
added tokens; what is left is pre-tokenized and each word given to the model. Added tokens
match leftmost-longest; `single_word` ones only between non-word characters; `lstrip` /
`rstrip` ones take the whitespace beside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import regex

from ember.tokenizers.base import Tokenizer, replace_lone_surrogates
from ember.tokenizers.formats.hf.models import build_model
from ember.tokenizers.formats.hf.pre_tokenizers import PreTokenize, build_pre_tokenizer
from ember.tokenizers.text.byte_level import ByteLevelCodec
from ember.tokenizers.text.normalizers import WHITE_SPACE, Normalizer, build_normalizer
from ember.tokenizers.text.pieces import byte_of_piece
from ember.tokenizers.text.specials import SpecialSet

_SPACE_CLASS = "[" + regex.escape("".join(sorted(WHITE_SPACE))) + "]*"
SPACE_AT_END = regex.compile(_SPACE_CLASS + r"\Z")
SPACE_AT_START = regex.compile(_SPACE_CLASS)
WORD_AT_START = regex.compile(r"\w")
WORD_AT_END = regex.compile(r"\w\Z")


@dataclass(frozen=True)
class AddedToken:
    """One entry of tokenizer.json's added_tokens, with the text it is matched as."""

    content: str
    token_id: int
    special: bool = False
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False

    @classmethod
    def from_spec(cls, entry: dict[str, Any]) -> AddedToken:
        return cls(
            content=entry["content"],
            token_id=entry["id"],
            special=bool(entry.get("special")),
            single_word=bool(entry.get("single_word")),
            lstrip=bool(entry.get("lstrip")),
            rstrip=bool(entry.get("rstrip")),
            normalized=bool(entry.get("normalized", not entry.get("special"))),
        )


class AddedTokenMatcher:
    """Finds added tokens in text as `tokenizers` does (leftmost-longest, then the flags)."""

    def __init__(self, tokens: dict[str, AddedToken]) -> None:
        self.tokens = tokens  # matched text -> token
        ordered = sorted(tokens, key=lambda text: (-len(text), text))
        self._pattern = regex.compile("|".join(map(regex.escape, ordered))) if ordered else None

    def split(self, text: str, allowed: frozenset[str]) -> list[tuple[str, int | None]]:
        """(chunk, None) for plain text and (text, id) for each added token found."""
        if self._pattern is None or not text:
            return [(text, None)] if text else []
        out: list[tuple[str, int | None]] = []
        position = 0
        for match in self._pattern.finditer(text):
            token = self.tokens[match.group()]
            start, stop = match.span()
            if token.content not in allowed:
                continue
            if token.single_word and (
                WORD_AT_END.search(text, 0, start) or WORD_AT_START.match(text, stop)
            ):
                continue
            if token.lstrip:
                start = max(SPACE_AT_END.search(text, 0, start).start(), position)
            if token.rstrip:
                stop = SPACE_AT_START.match(text, stop).end()
            if start > position:
                out.append((text[position:start], None))
            out.append((text[start:stop], token.token_id))
            position = stop
        if position < len(text):
            out.append((text[position:], None))
        return out


class PipelineTokenizer(Tokenizer):
    """A tokenizer.json run stage by stage (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], name: str = "tokenizer.json", chat_template: str | None = None,
                 extra_eos_ids: Iterable[int] = ()) -> None:
        """`chat_template` and `extra_eos_ids` (ids beyond EOS that end generation) come from the folder around it."""
        self.name = name
        self._chat_template = chat_template
        self._extra_eos_ids = frozenset(extra_eos_ids)
        self._normalize: Normalizer | None = build_normalizer(spec.get("normalizer"))
        self._pre_tokenize: PreTokenize = build_pre_tokenizer(spec.get("pre_tokenizer"))
        self._model = build_model(spec["model"])
        added = [AddedToken.from_spec(entry) for entry in spec.get("added_tokens", [])]
        self._added = {token.content: token for token in added}
        self._raw_matcher = AddedTokenMatcher({t.content: t for t in added if not t.normalized})
        normalized = {}
        for token in added:
            if token.normalized:
                text = self._normalize(token.content) if self._normalize else token.content
                normalized[text] = token
        self._normalized_matcher = AddedTokenMatcher(normalized)
        self._special_ids = frozenset(t.token_id for t in added if t.special)
        # Non-special added tokens are vocabulary: `tokenizers` matches them in every text.
        self._always_matched = frozenset(t.content for t in added if not t.special)
        self._prefix_ids, self._suffix_ids = _template_ids(spec.get("post_processor"), self._added)
        vocab: dict[str, int] = dict(self._model.vocab)
        vocab.update({token.content: token.token_id for token in added})
        self._tokens_by_id = {token_id: token for token, token_id in vocab.items()}
        self._vocab_size = max(self._tokens_by_id, default=-1) + 1
        self._surface, self._strips_leading_space = _surface_rules(spec.get("decoder"))
        self._has_byte_fallback_decoder = _has_decoder(spec.get("decoder"), "ByteFallback")
        self._token_bytes: dict[int, bytes] = {}
        self.bos_token_id: int | None = self._prefix_ids[0] if self._prefix_ids else None
        self.eos_token_id: int | None = self._suffix_ids[-1] if self._suffix_ids else None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        return self.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self.eos_token_id

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._extra_eos_ids | ({self.eos_token_id} if self.eos_token_id is not None else frozenset())

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def add_bos(self) -> bool:
        return bool(self._prefix_ids)

    @property
    def strips_leading_space(self) -> bool:
        return self._strips_leading_space

    @property
    def special_tokens(self) -> dict[str, int]:
        return {text: token.token_id for text, token in self._added.items()}

    def encode(
        self,
        text: str,
        add_special_tokens: bool = False,
        *,
        allowed_special: SpecialSet = "all",
        disallowed_special: SpecialSet = (),
    ) -> list[int]:
        """Token ids of `text`; `add_special_tokens=True` adds the post-processor's template
        tokens (e.g. BERT's [CLS] ... [SEP]). Added-token text in `allowed_special` becomes
        that token (all of them by default, as in `tokenizers`); non-special added tokens
        are matched whatever `allowed_special` says."""
        text = replace_lone_surrogates(text)
        every = frozenset(self._added)
        allowed = every if allowed_special == "all" else frozenset(allowed_special)
        allowed |= self._always_matched
        disallowed = (
            every - allowed if disallowed_special == "all" else frozenset(disallowed_special)
        )
        for content in disallowed:
            if content in text:
                raise ValueError(
                    f"text contains the added token {content!r}, which is disallowed; pass "
                    "allowed_special to match it or disallowed_special=() to encode it as text"
                )
        ids = list(self._prefix_ids) if add_special_tokens else []
        offset = 0
        for chunk, token_id in self._raw_matcher.split(text, allowed):
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self._encode_chunk(chunk, at_text_start=offset == 0, allowed=allowed))
            offset += len(chunk)
        if add_special_tokens:
            ids.extend(self._suffix_ids)
        return ids

    def _encode_chunk(self, chunk: str, at_text_start: bool, allowed: frozenset[str]) -> list[int]:
        if self._normalize is not None:
            chunk = self._normalize(chunk)
        ids: list[int] = []
        for index, (piece, token_id) in enumerate(self._normalized_matcher.split(chunk, allowed)):
            if token_id is not None:
                ids.append(token_id)
                continue
            for word in self._pre_tokenize(piece, at_text_start and index == 0):
                if word:
                    ids.extend(self._model.tokenize(word))
        return ids

    def has_token(self, token_id: int) -> bool:
        return token_id in self._tokens_by_id

    def is_run_byte(self, token_id: int) -> bool:
        return self._has_byte_fallback_decoder and byte_of_piece(self._tokens_by_id[token_id]) is not None

    def keeps_text_start(self, token_id: int) -> bool:
        # `tokenizers` runs its decoders over the id list as given (specials included unless
        # skipped): only the very first token loses its leading space.
        return False

    def token_bytes(self, token_id: int) -> bytes:
        data = self._token_bytes.get(token_id)
        if data is None:
            token = self._tokens_by_id.get(token_id)
            if token is None:
                raise ValueError(
                    f"token id {token_id} is not in this vocabulary (size {self.vocab_size})"
                )
            data = self._surface(token)  # added tokens go through the decoders too, as in HF
            self._token_bytes[token_id] = data
        return data

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def id_to_piece(self, token_id: int) -> str:
        return self._tokens_by_id[token_id]

    def __repr__(self) -> str:
        return f"PipelineTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def _template_ids(
    post_processor: dict[str, Any] | None, added: dict[str, AddedToken]
) -> tuple[list[int], list[int]]:
    """The special-token ids a TemplateProcessing (or BertProcessing / RobertaProcessing)
    puts before and after a single text."""
    if not post_processor:
        return [], []
    kind = post_processor.get("type")
    if kind == "Sequence":
        for part in post_processor.get("processors", []):
            found = _template_ids(part, added)
            if found != ([], []):
                return found
        return [], []
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [post_processor["cls"][1]], [post_processor["sep"][1]]
    if kind != "TemplateProcessing":
        return [], []
    specials = post_processor.get("special_tokens", {})
    prefix: list[int] = []
    suffix: list[int] = []
    seen_sequence = False
    for item in post_processor.get("single", []):
        if "Sequence" in item:
            seen_sequence = True
            continue
        name = item["SpecialToken"]["id"]
        ids = specials.get(name, {}).get("ids") or [added[name].token_id]
        (suffix if seen_sequence else prefix).extend(ids)
    return prefix, suffix


def _surface_rules(decoder: dict[str, Any] | None):
    """(token -> bytes as it reads inside a text, whether a text's first space is dropped),
    from the decoder chain: each decoder rewrites a token independently, which is what lets
    the incremental decoder stream these vocabularies."""
    steps = _decoder_steps(decoder)
    strips = any(strips_first for _, strips_first in steps)

    def surface(token: str) -> bytes:
        value: str | bytes = token
        for step, _ in steps:
            value = step(value)
        return value if isinstance(value, bytes) else value.encode()

    return surface, strips


def _has_decoder(decoder: dict[str, Any] | None, kind: str) -> bool:
    """Whether the decoder chain holds a decoder of type `kind`."""
    if decoder is None:
        return False
    if decoder.get("type") == "Sequence":
        return any(_has_decoder(part, kind) for part in decoder["decoders"])
    return decoder.get("type") == kind


def _decoder_steps(decoder: dict[str, Any] | None) -> list[tuple[Any, bool]]:
    if decoder is None:
        # Without a decoder `tokenizers` joins the tokens with single spaces.
        return [(lambda token: " " + token, True)]
    kind = decoder.get("type")
    if kind == "Sequence":
        return [step for part in decoder["decoders"] for step in _decoder_steps(part)]
    if kind == "ByteLevel":
        codec = ByteLevelCodec()
        return [(lambda token: _to_bytes(codec, token), False)]
    if kind == "ByteFallback":
        return [(_byte_fallback, False)]
    if kind == "Metaspace":
        replacement = decoder.get("replacement", "\u2581")
        scheme = decoder.get("prepend_scheme") or (
            "always" if decoder.get("add_prefix_space", True) else "never"
        )
        return [(lambda token: _replace(token, replacement, " "), scheme != "never")]
    if kind == "Replace":
        pattern = decoder["pattern"].get("String")
        if pattern is None:
            raise ValueError("tokenizer.json Replace decoder with a regex is not supported")
        return [(lambda token: _replace(token, pattern, decoder["content"]), False)]
    if kind == "Strip":
        strips_first = decoder.get("content") == " " and decoder.get("start", 0) >= 1
        return [(lambda token: token, strips_first)]
    if kind == "WordPiece":
        prefix = decoder.get("prefix", "##")
        return [(lambda token: _word_piece(token, prefix), True)]
    if kind == "BPEDecoder":
        suffix = decoder.get("suffix", "</w>")
        return [(lambda token: _replace(token, suffix, " "), False)]
    if kind == "Fuse":
        return []
    raise ValueError(f"tokenizer.json decoder {kind!r} is not supported by ember.tokenizers")


def _to_bytes(codec: ByteLevelCodec, token: str | bytes) -> bytes:
    if isinstance(token, bytes):
        return token
    try:
        return codec.to_bytes(token)
    except ValueError:
        return token.encode()


def _byte_fallback(token: str | bytes) -> str | bytes:
    if isinstance(token, str):
        byte = byte_of_piece(token)
        if byte is not None:
            return bytes([byte])
    return token


def _replace(token: str | bytes, old: str, new: str) -> str | bytes:
    if isinstance(token, bytes):
        return token.replace(old.encode(), new.encode())
    return token.replace(old, new)


def _word_piece(token: str | bytes, prefix: str) -> str | bytes:
    if isinstance(token, bytes):
        return token
    return token[len(prefix) :] if token.startswith(prefix) else " " + token
