"""llama.cpp's WordPiece ("WPM") tokenizer, for GGUF vocabularies of model "bert".

The rules are llama.cpp's (llama-vocab.cpp), which differ from HF's BertNormalizer +
BertPreTokenizer + WordPiece in ways that change ids, so a GGUF BERT vocabulary follows them:
- Normalisation is per code point. With `strip_accents` a code point is replaced by the FIRST
  code point of its NFD form (a Hangul syllable becomes its leading jamo, "é" becomes "e"),
  then marks (\\p{M}) are dropped. Lowercasing is Unicode's simple (one code point) mapping.
- Words end at whitespace (Unicode White_Space); NUL, U+FFFD and \\p{C} are dropped;
  punctuation (\\p{P}), ASCII symbols and CJK ideographs are words of their own.
- Each word, spelled with a leading "▁" (GGUF's form of a word-initial piece; continuation
  pieces have no prefix), is cut greedily into the longest vocabulary entries from the left;
  a word with any part that matches nothing is the unknown token. No length limit.
Special tokens are cut out first as for every GGUF vocabulary (`SpecialTokenMatcher` with
llama.cpp's longest-first order); `add_special_tokens=True` wraps a text in [CLS] ... [SEP].
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from ember.tokenizers.base import Tokenizer, replace_lone_surrogates
from ember.tokenizers.text.normalizers import is_cjk, is_white_space
from ember.tokenizers.text.piece_cache import PieceCache
from ember.tokenizers.text.pieces import PieceKind
from ember.tokenizers.text.specials import SpecialSet, SpecialTokenMatcher

WORD_START = "\u2581"
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})


class _CharRules(dict):
    """char -> what llama.cpp's WPM preprocessing makes of it: "" (dropped), " " (a word
    break), " c " (a word of its own) or the char itself, lowercased. Filled on first sight
    of each char, so that `str.translate` applies the rules at C speed afterwards."""

    def __init__(self, lowercase: bool, strip_accents: bool) -> None:
        super().__init__()
        self.lowercase = lowercase
        self.strip_accents = strip_accents

    def __missing__(self, code: int) -> str:
        self[code] = rule = self._rule(chr(code))
        return rule

    def _rule(self, char: str) -> str:
        if self.strip_accents:
            char = unicodedata.normalize("NFD", char)[0]
        if is_white_space(char):  # Unicode White_Space, the same table as llama.cpp's
            return " "
        category = unicodedata.category(char)
        if char in "\x00\ufffd" or category in CONTROL_CATEGORIES:
            return ""
        if self.strip_accents and category[0] == "M":
            return ""
        out = char.lower()[0] if self.lowercase else char  # simple mapping: İ -> i
        if category[0] == "P" or (ord(char) < 0x7F and category[0] == "S") or is_cjk(char):
            return f" {out} "
        return out


class GGUFWordPieceTokenizer(Tokenizer):
    """A GGUF "bert" vocabulary run with llama.cpp's WPM rules (see the module docstring)."""

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        kinds: Sequence[PieceKind],
        unk_id: int,
        cls_id: int | None,
        sep_id: int | None,
        lowercase: bool = True,
        strip_accents: bool = True,
        name: str = "gguf-wordpiece",
    ) -> None:
        self.name = name
        # llama.cpp names an empty entry "[EMPTY_<id>]"; a repeated text maps to its last id.
        self._tokens = [token or f"[EMPTY_{token_id}]" for token_id, token in enumerate(tokens)]
        self._kinds = [PieceKind(kind) for kind in kinds]
        self._ids = {token: token_id for token_id, token in enumerate(self._tokens)}
        self._max_chars = max(map(len, self._tokens), default=1)
        self._unk_id, self._cls_id, self._sep_id = unk_id, cls_id, sep_id
        self._rules = _CharRules(lowercase, strip_accents)
        matched = (PieceKind.CONTROL, PieceKind.USER_DEFINED, PieceKind.UNKNOWN)
        special_tokens = {
            token: token_id
            for token_id, (token, kind) in enumerate(zip(self._tokens, self._kinds, strict=True))
            if kind in matched
        }
        user_defined = frozenset(
            token
            for token, kind in zip(self._tokens, self._kinds, strict=True)
            if kind == PieceKind.USER_DEFINED
        )
        self._specials = SpecialTokenMatcher(
            special_tokens, always_matched=user_defined, longest_first=True
        )
        self._special_ids = frozenset(
            token_id for token_id, kind in enumerate(self._kinds) if kind == PieceKind.CONTROL
        )
        self._word_cache: PieceCache[list[int]] = PieceCache()

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        return self._cls_id

    @property
    def eos_id(self) -> int | None:
        return self._sep_id

    @property
    def add_bos(self) -> bool:
        return self._cls_id is not None

    @property
    def strips_leading_space(self) -> bool:
        return True

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials.special_tokens)

    def encode(
        self,
        text: str,
        add_special_tokens: bool = False,
        *,
        allowed_special: SpecialSet = "all",
        disallowed_special: SpecialSet = (),
    ) -> list[int]:
        """Token ids of `text`; `add_special_tokens=True` wraps them in [CLS] ... [SEP].
        Special-token rules as in `ByteLevelBPETokenizer.encode`."""
        text = replace_lone_surrogates(text)
        ids = self._specials.encode(text, allowed_special, disallowed_special, self.encode_ordinary)
        if not add_special_tokens:
            return ids
        cls = [] if self._cls_id is None else [self._cls_id]
        sep = [] if self._sep_id is None else [self._sep_id]
        return cls + ids + sep

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text` with no special-token matching."""
        ids: list[int] = []
        for word in text.translate(self._rules).split():
            found = self._word_cache.get(word)
            if found is None:
                found = self._word_ids(word)
                self._word_cache.remember(word, found)
            ids.extend(found)
        return ids

    def _word_ids(self, word: str) -> list[int]:
        """Greedy longest match from the left over "▁" + word; any unmatched part: [UNK]."""
        spelled = WORD_START + word
        ids, start, vocab = [], 0, self._ids
        while start < len(spelled):
            for end in range(min(len(spelled), start + self._max_chars), start, -1):
                token_id = vocab.get(spelled[start:end])
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                return [self._unk_id]
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._tokens):
            raise ValueError(
                f"token id {token_id} is not in this vocabulary (size {self.vocab_size})"
            )
        token = self._tokens[token_id]
        if self._kinds[token_id] == PieceKind.NORMAL:
            token = token.replace(WORD_START, " ")
        return token.encode()

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def id_to_piece(self, token_id: int) -> str:
        return self._tokens[token_id]

    def __repr__(self) -> str:
        return f"GGUFWordPieceTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"
