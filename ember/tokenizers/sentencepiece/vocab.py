"""What every SentencePiece-style vocabulary shares: scored pieces with kinds, the `▁` space
convention and dummy prefix, special-token matching, byte-fallback spelling and decoding.
Subclasses only say how normalised text is segmented (BPE merges, Unigram Viterbi).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ember.tokenizers.base import Tokenizer, replace_lone_surrogates
from ember.tokenizers.text.pieces import PieceKind, byte_of_piece
from ember.tokenizers.text.sentencepiece_normalizer import CharsMap, normalize_units
from ember.tokenizers.text.specials import SpecialSet, SpecialTokenMatcher

SPACE_MARKER = "\u2581"
# surrogateescape's stand-ins for the bytes 0x80..0xFF, each mapped to U+FFFD.
ESCAPED_BYTES_AS_REPLACEMENT = {code: "\ufffd" for code in range(0xDC80, 0xDD00)}


@dataclass(frozen=True)
class SentencePieceOptions:
    """How text is normalised before merging, and which pieces may be formed by merges.

    `space_marker` replaces every space (" " for llama2.c files, which store real spaces);
    `merge_kinds` are the piece kinds a merge may produce (llama2.c: every piece);
    `prefix_after_special`: whether text after a special token gets the dummy prefix too
    (llama.cpp and HF do this; sentencepiece never sees special tokens in text);
    `longest_special_first`: llama.cpp's order of cutting special tokens out of text (GGUF);
    `user_defined_after_normalizing`: sentencepiece's order (`.model` files): the whole text is
    normalised, user-defined pieces kept whole and verbatim, and those pieces are then matched in
    the normalised text (so the dummy prefix comes once, before a leading user-defined piece);
    otherwise, as llama.cpp does, they are cut out of the raw text and each chunk is normalised
    on its own.
    """

    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = False
    space_marker: str = SPACE_MARKER
    byte_fallback: bool = True
    merge_kinds: frozenset[PieceKind] = frozenset({PieceKind.NORMAL, PieceKind.USER_DEFINED})
    prefix_after_special: bool = True
    longest_special_first: bool = False
    user_defined_after_normalizing: bool = False
    # What the unknown piece decodes to (sentencepiece: " \u2047 "); None: its own text.
    unknown_surface: str | None = None
    # Compiled normalisation rules of a .model file (e.g. nmt_nfkc); None: identity.
    charsmap: CharsMap | None = None


class SentencePieceTokenizer(Tokenizer):
    """A scored piece vocabulary; `_segment` (in a subclass) turns normalised text into ids."""

    def __init__(
        self,
        *,
        pieces: Sequence[str],
        scores: Sequence[float],
        kinds: Sequence[PieceKind],
        options: SentencePieceOptions,
        bos_id: int | None,
        eos_id: int | None,
        unk_id: int | None,
        add_bos: bool = True,
        extra_eos_ids: Iterable[int] = (),
        special_tokens: dict[str, int] | None = None,
        chat_template: str | None = None,
        name: str = "sentencepiece",
    ) -> None:
        if not len(pieces) == len(scores) == len(kinds):
            raise ValueError("pieces, scores and kinds must have the same length")
        self.name = name
        self.options = options
        self._pieces = list(pieces)
        self._kinds = [PieceKind(kind) for kind in kinds]
        self._bos_id, self._eos_id, self._unk_id = bos_id, eos_id, unk_id
        self._add_bos = add_bos
        self._eos_ids = frozenset([*([] if eos_id is None else [eos_id]), *extra_eos_ids])
        self._chat_template = chat_template
        self._scores = [float(score) for score in scores]
        self._byte_ids: list[int | None] = [None] * 256
        for token_id, (piece, kind) in enumerate(zip(pieces, kinds, strict=False)):
            byte = byte_of_piece(piece)
            usable = kind in (PieceKind.BYTE, PieceKind.NORMAL)
            if byte is not None and usable and self._byte_ids[byte] is None:
                self._byte_ids[byte] = token_id
        self._has_byte_fallback = options.byte_fallback and None not in self._byte_ids
        if special_tokens is None:
            special_tokens = {
                piece: token_id
                for token_id, (piece, kind) in enumerate(zip(pieces, kinds, strict=False))
                if kind in (PieceKind.CONTROL, PieceKind.USER_DEFINED)
            }
        # User-defined pieces are vocabulary: sentencepiece and llama.cpp match them always.
        user_defined = frozenset(
            piece
            for piece, kind in zip(pieces, self._kinds, strict=False)
            if kind == PieceKind.USER_DEFINED
        )
        self._specials = SpecialTokenMatcher(
            special_tokens,
            always_matched=user_defined,
            longest_first=options.longest_special_first,
        )
        self._user_defined = user_defined & frozenset(special_tokens)
        self._special_ids = frozenset(
            token_id for token_id, kind in enumerate(self._kinds) if kind == PieceKind.CONTROL
        )
        self._token_bytes = [
            self._piece_bytes(piece, kind) for piece, kind in zip(pieces, kinds, strict=False)
        ]

    def _piece_bytes(self, piece: str, kind: PieceKind) -> bytes:
        byte = byte_of_piece(piece)
        if byte is not None and kind in (PieceKind.BYTE, PieceKind.NORMAL):
            return bytes([byte])
        if kind == PieceKind.UNKNOWN and self.options.unknown_surface is not None:
            return self.options.unknown_surface.encode()
        if kind in (PieceKind.CONTROL, PieceKind.UNKNOWN):
            return piece.encode()
        return piece.replace(self.options.space_marker, " ").encode()

    # --- the Tokenizer contract -------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

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
    def strips_leading_space(self) -> bool:
        return self.options.add_dummy_prefix

    @property
    def pieces(self) -> list[str]:
        """The vocabulary's pieces, by id."""
        return list(self._pieces)

    def encode(
        self,
        text: str,
        add_special_tokens: bool = False,
        *,
        allowed_special: SpecialSet = "all",
        disallowed_special: SpecialSet = (),
    ) -> list[int]:
        """Token ids of `text`; control/user-defined piece text in `allowed_special` becomes
        that piece (pass `allowed_special=()` for sentencepiece's behaviour, which never
        matches them); see `ByteLevelBPETokenizer.encode` for the special-token rules."""
        text = replace_lone_surrogates(text)
        ids: list[int] = []
        if add_special_tokens and self._add_bos and self._bos_id is not None:
            ids.append(self._bos_id)
        allowed, disallowed = self._specials.resolve(allowed_special, disallowed_special)
        self._specials.check_disallowed(text, disallowed)
        if self.options.user_defined_after_normalizing:
            allowed -= self._user_defined  # matched by `encode_ordinary`, after normalising
        is_first = True
        after_special = False
        for chunk, special_id in self._specials.split(text, allowed):
            if special_id is not None:
                ids.append(special_id)
                after_special = True
            else:
                prefix = is_first or (after_special and self.options.prefix_after_special)
                ids.extend(self.encode_ordinary(chunk, add_dummy_prefix=prefix))
                after_special = False
            is_first = False
        return ids

    def encode_ordinary(self, text: str, add_dummy_prefix: bool = True) -> list[int]:
        """Token ids of `text` with no special-token matching (user-defined pieces are matched
        here, in the normalised text, under `user_defined_after_normalizing`)."""
        normalized = self.normalize(text, add_dummy_prefix)
        if not normalized:
            return []
        if not self.options.user_defined_after_normalizing:
            return self._segment(normalized)
        ids: list[int] = []
        # User-defined pieces never merge with their neighbours (sentencepiece freezes them).
        for chunk, user_defined_id in self._specials.split(normalized, self._user_defined):
            if user_defined_id is None:
                ids.extend(self._segment(chunk))
            else:
                ids.append(user_defined_id)
        return ids

    def normalize(self, text: str, add_dummy_prefix: bool = True) -> str:
        """`text` as the merge loop sees it: whitespace handled, dummy prefix, space marker."""
        options = self.options
        units = self._normalization_units(text)
        if units is not None:
            return normalize_units(
                units,
                add_dummy_prefix=options.add_dummy_prefix and add_dummy_prefix,
                remove_extra_whitespaces=options.remove_extra_whitespaces,
                space_marker=options.space_marker,
            )
        if options.remove_extra_whitespaces:
            text = " ".join(part for part in text.split(" ") if part)
        if not text:
            return ""
        if options.add_dummy_prefix and add_dummy_prefix:
            text = " " + text
        if options.space_marker != " ":
            text = text.replace(" ", options.space_marker)
        if options.remove_extra_whitespaces:
            # sentencepiece strips trailing markers after escaping, literal "▁" included.
            text = text.rstrip(options.space_marker)
        return text

    def _normalization_units(self, text: str) -> list[str] | None:
        """`text` cut into the units sentencepiece's normaliser handles one at a time (compiled
        rules' matches, single characters, user-defined pieces whole and unnormalised), or None
        when there are neither rules nor user-defined pieces in the text to respect."""
        charsmap = self.options.charsmap
        protects_user_defined = self.options.user_defined_after_normalizing and self._user_defined
        chunks = list(self._specials.split(text, self._user_defined)) if protects_user_defined else []
        if all(user_defined_id is None for _, user_defined_id in chunks):
            return None if charsmap is None else charsmap.apply(text)
        units: list[str] = []
        for chunk, user_defined_id in chunks:
            if user_defined_id is not None:
                units.append(chunk)
            else:
                units.extend(list(chunk) if charsmap is None else charsmap.apply(chunk))
        return units

    @abstractmethod
    def _segment(self, normalized: str) -> list[int]:
        """Token ids of non-empty normalised text."""

    def _spell_unknown(self, symbol: str) -> list[int]:
        """Ids for a symbol outside the vocabulary: its UTF-8 bytes as byte pieces where the
        vocabulary has them, else the unknown piece."""
        if self._has_byte_fallback:
            return [self._byte_ids[byte] for byte in symbol.encode("utf-8")]
        if self._unk_id is not None:
            return [self._unk_id]
        raise ValueError(f"{symbol!r} is not in the vocabulary, which has no unknown piece")

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._token_bytes):
            raise ValueError(
                f"token id {token_id} is not in this vocabulary (size {self.vocab_size})"
            )
        return self._token_bytes[token_id]

    def text_of_bytes(self, data: bytes) -> str:
        """Decoded bytes as text, as sentencepiece decodes byte pieces: every byte that is not
        part of a valid UTF-8 character becomes its own U+FFFD."""
        return data.decode("utf-8", errors="surrogateescape").translate(ESCAPED_BYTES_AS_REPLACEMENT)

    def keeps_text_start(self, token_id: int) -> bool:
        # sentencepiece decodes control pieces to nothing and its unknown piece keeps the start.
        return self._kinds[token_id] in (PieceKind.UNKNOWN, PieceKind.CONTROL)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def id_to_piece(self, token_id: int) -> str:
        return self._pieces[token_id]
