"""Byte-level BPE tokenizers: GPT-2, tiktoken encodings, Llama 3, Qwen2, SmolLM2.

Text is split at special tokens, each ordinary chunk is cut into pieces by the
pre-tokenizer, and each piece's UTF-8 bytes are merged by the merge table. Results are
cached per piece on the instance, which is what makes pure Python fast on real text (a
few thousand distinct pieces cover most of any corpus).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import compress, repeat
from operator import is_

from ember.tokenizers.base import Tokenizer, replace_lone_surrogates
from ember.tokenizers.bpe.merges import BytePairMerger
from ember.tokenizers.text.patterns import PreTokenizer
from ember.tokenizers.text.piece_cache import PieceCache
from ember.tokenizers.text.specials import SpecialSet, SpecialTokenMatcher


class ByteLevelBPETokenizer(Tokenizer):
    """A byte-level BPE vocabulary with its pre-tokenizer and special tokens.

    `token_bytes_by_id[i]` is the byte string of ordinary token i (None for ids that are
    unused or special). `special_tokens` maps special-token text to id; `special_ids` are the
    ids that `is_special` reports (and `decode(skip_special_tokens=True)` drops): by default
    every special token, but loaders pass a narrower set where a format marks some added
    tokens as non-special. Those are ordinary vocabulary matched whole in every text,
    whatever `allowed_special` says (see `SpecialTokenMatcher`). `longest_special_first`:
    llama.cpp's order of cutting special tokens out of text (GGUF files).
    """

    def __init__(
        self,
        *,
        merger: BytePairMerger,
        pre_tokenizer: PreTokenizer,
        token_bytes_by_id: list[bytes | None],
        special_tokens: dict[str, int],
        special_ids: Iterable[int] | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        extra_eos_ids: Iterable[int] = (),
        add_bos: bool = False,
        suffix_ids: Iterable[int] = (),
        chat_template: str | None = None,
        ignore_merges: bool = False,
        normalize: Callable[[str], str] | None = None,
        strip_left: Iterable[str] = (),
        strip_right: Iterable[str] = (),
        longest_special_first: bool = False,
        name: str = "bpe",
    ) -> None:
        self.name = name
        self._merger = merger
        self._pre_tokenizer = pre_tokenizer
        self._token_bytes = list(token_bytes_by_id)
        self._special_ids = frozenset(
            special_tokens.values() if special_ids is None else special_ids
        )
        self._specials = SpecialTokenMatcher(
            special_tokens,
            frozenset(strip_left),
            frozenset(strip_right),
            always_matched=frozenset(
                text
                for text, token_id in special_tokens.items()
                if token_id not in self._special_ids
            ),
            longest_first=longest_special_first,
        )
        self._special_bytes = {token_id: text.encode() for text, token_id in special_tokens.items()}
        size = max([len(self._token_bytes) - 1, *special_tokens.values()], default=-1) + 1
        self._vocab_size = size
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._eos_ids = frozenset([*([] if eos_id is None else [eos_id]), *extra_eos_ids])
        self._add_bos = add_bos
        self._suffix_ids = list(suffix_ids)  # appended by add_special_tokens=True (a post-processor's trailing EOS)
        self._chat_template = chat_template
        self._normalize = normalize
        single_bytes = {data for data in self._token_bytes if data is not None and len(data) == 1}
        self._bytes_without_token = tuple(
            bytes([b]) for b in range(256) if bytes([b]) not in single_bytes
        )
        self._max_bytes_per_token = _max_bytes_per_token(
            self._token_bytes, self._special_bytes.values(), normalize, strip_left, strip_right
        )
        # Per-piece caches: pieces that are one token map to its id (the common case, kept
        # apart so that a run of them is answered by one C-level map), the rest to id lists.
        # HF's `ignore_merges` (Llama 3) and tiktoken take a piece that is itself a token
        # whole: seeding the one-token cache with every token gives exactly that.
        self._whole_pieces: dict[str, int] = {}
        if ignore_merges:
            for token_id, data in enumerate(self._token_bytes):
                text = None if data is None else data.decode("utf-8", errors="replace")
                if text is not None and "\ufffd" not in text:
                    self._whole_pieces[text] = token_id
        self._single_cache: PieceCache[int] = PieceCache(self._whole_pieces)
        self._multi_cache: PieceCache[list[int]] = PieceCache()

    # --- the Tokenizer contract -------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos_ids

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def uses_compiled_core(self) -> bool:
        """Whether merges run in the optional compiled core (see native.py)."""
        return self._merger.is_native

    @property
    def missing_bytes(self) -> frozenset[int]:
        """Byte values this vocabulary has no token for: `encode` drops them, as HF's BPE and
        llama.cpp do (SmolLM2 lacks 0xF1, the lead byte of U+40000..U+7FFFF), so they are
        the only bytes `decode(encode(text))` can lose."""
        return self._merger.missing_bytes

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special-token text -> id (every token matched whole in text)."""
        return dict(self._specials.special_tokens)

    def encode(
        self,
        text: str,
        add_special_tokens: bool = False,
        *,
        allowed_special: SpecialSet = "all",
        disallowed_special: SpecialSet = (),
    ) -> list[int]:
        """Token ids of `text`.

        Special-token text in `allowed_special` becomes the special token; text of a token in
        `disallowed_special` raises ValueError; other special-token text is encoded as
        ordinary text. Non-special added tokens are matched whatever these say. tiktoken's defaults are allowed=(), disallowed="all"; ember's are
        allowed="all" because chat templates render special tokens as text.
        `add_special_tokens=True` prepends BOS when the vocabulary asks for it (`add_bos`) and appends the tokens its
        post-processor puts after a text (`suffix_ids`).
        """
        text = replace_lone_surrogates(text)
        if self._normalize is not None:
            text = self._normalize(text)
        ids = self._specials.encode(text, allowed_special, disallowed_special, self.encode_ordinary)
        if add_special_tokens and self._add_bos and self._bos_id is not None:
            ids.insert(0, self._bos_id)
        if add_special_tokens:
            ids.extend(self._suffix_ids)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text` with no special-token matching at all."""
        pieces = self._pre_tokenizer.split(text)
        ids = list(map(self._single_cache.get, pieces))
        if None not in ids:
            return ids
        # Merge each distinct uncached piece once (a run of 4M digits is 4M equal pieces),
        # fill in those that are one token with a C-level map, splice the rest in.
        missing = set(compress(pieces, map(is_, ids, repeat(None))))
        resolved = {piece: self._piece_ids(piece) for piece in missing}
        singles = {piece: found[0] for piece, found in resolved.items() if len(found) == 1}
        if singles:
            ids = list(map(singles.get, pieces, ids))
            if None not in ids:
                return ids
        out: list[int] = []
        start = 0
        while True:
            try:
                at = ids.index(None, start)
            except ValueError:  # no multi-token piece left
                break
            out += ids[start:at]
            out += resolved[pieces[at]]
            start = at + 1
        out += ids[start:]
        return out

    def _piece_ids(self, piece: str) -> list[int]:
        """Ids of one piece that is not a cached single token (merged and cached here)."""
        ids = self._multi_cache.get(piece)
        if ids is not None:
            return ids
        ids = self._merger.merge_uncached(piece.encode("utf-8"))
        if len(ids) == 1:
            self._single_cache.remember(piece, ids[0])
        else:
            self._multi_cache.remember(piece, ids)
        return ids

    def min_token_count(self, text: str) -> int:
        """The text's UTF-8 length over the longest token's (0 when text may be folded away).

        Encoding is lossless here (the tokens' bytes add up to the text's, unencodable
        characters counted as one byte at most), so no fewer tokens can spell it.
        """
        if self._max_bytes_per_token is None:
            return 0
        data = text.encode("utf-8", errors="replace")
        # A byte with no token of its own may be dropped (SmolLM2 has none for 0x16): not counted.
        num_bytes = len(data) - sum(data.count(byte) for byte in self._bytes_without_token)
        return -(-num_bytes // self._max_bytes_per_token)

    def has_token(self, token_id: int) -> bool:
        if token_id in self._special_bytes:
            return True
        return 0 <= token_id < len(self._token_bytes) and self._token_bytes[token_id] is not None

    def token_bytes(self, token_id: int) -> bytes:
        special = self._special_bytes.get(token_id)
        if special is not None:
            return special
        if 0 <= token_id < len(self._token_bytes):
            data = self._token_bytes[token_id]
            if data is not None:
                return data
        raise ValueError(f"token id {token_id} is not in this vocabulary (size {self.vocab_size})")

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The exact bytes of `ids` (no UTF-8 repair)."""
        return b"".join(self.token_bytes(token_id) for token_id in ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`; ids with no token are skipped (see `Tokenizer.has_token`)."""
        ids = [token_id for token_id in ids if self.has_token(token_id)]
        if skip_special_tokens:
            ids = [token_id for token_id in ids if token_id not in self._special_ids]
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"ByteLevelBPETokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def _max_bytes_per_token(
    token_bytes_by_id: list[bytes | None],
    special_bytes: Iterable[bytes],
    normalize: Callable[[str], str] | None,
    strip_left: Iterable[str],
    strip_right: Iterable[str],
) -> int | None:
    """The most text bytes one token can stand for, or None when that does not bound the count:
    a normalizer may shrink text (NFC, NFKC) and stripping special tokens swallow whitespace."""
    if normalize is not None or any(strip_left) or any(strip_right):
        return None
    lengths = [len(data) for data in token_bytes_by_id if data is not None]
    lengths.extend(len(data) for data in special_bytes)
    return max(lengths, default=1) or 1
