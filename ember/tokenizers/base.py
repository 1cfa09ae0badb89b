"""The one interface every ember tokenizer offers, and the streaming decoder built on it."""

from __future__ import annotations

from abc import ABC, abstractmethod


def replace_lone_surrogates(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD.

    A Python str may hold a lone surrogate (U+D800..U+DFFF, e.g. from JSON "\\ud800"), which
    has no UTF-8 form. Every ember tokenizer encodes it as U+FFFD, as tiktoken does (the
    `tokenizers` and `sentencepiece` bindings refuse such strings): `encode` is total.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class Tokenizer(ABC):
    """Text <-> token ids for one vocabulary.

    `encode` is total: every str encodes (lone surrogates as U+FFFD, see
    `replace_lone_surrogates`), and `decode(encode(text)) == text` wherever the vocabulary can
    spell every byte of `text`.

    `token_bytes(id)` is the exact byte string a token stands for (special tokens: their
    text), which is what lets `IncrementalDecoder` stream text without breaking UTF-8.
    `strips_leading_space` is True for SentencePiece-style vocabularies, whose decoder
    drops the space that the first piece of a text carries.
    """

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def bos_id(self) -> int | None: ...

    @property
    @abstractmethod
    def eos_id(self) -> int | None: ...

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation (EOS plus e.g. end-of-turn tokens)."""
        return frozenset() if self.eos_id is None else frozenset({self.eos_id})

    @property
    def add_bos(self) -> bool:
        """Whether `encode(..., add_special_tokens=True)` prepends BOS."""
        return False

    @property
    def chat_template(self) -> str | None:
        return None

    @property
    def strips_leading_space(self) -> bool:
        return False

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token text inside it is recognised as the special token."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes: ...

    @abstractmethod
    def is_special(self, token_id: int) -> bool: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        decoder = IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)
        return decoder.push_many(ids) + decoder.flush()

    def min_token_count(self, text: str) -> int:
        """A lower bound on `len(encode(text))` found without tokenizing (0 when none is known).

        Lets a server refuse a prompt that cannot fit a context window before paying for its
        tokenization. It must never overestimate: a prompt that would fit must not be refused.
        """
        return 0

    def keeps_text_start(self, token_id: int) -> bool:
        """Whether decoding this (non-special) token leaves the start-of-text state alone, so
        the next piece still loses its leading space (sentencepiece's unknown piece does)."""
        return False

    def id_to_piece(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


class IncrementalDecoder:
    """Turns a stream of token ids into a stream of text, never emitting broken UTF-8.

    Bytes that do not yet form a complete UTF-8 character are held back until the next
    token completes them; `flush()` releases what is left (invalid bytes as U+FFFD).
    """

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = False, at_start: bool = True
    ) -> None:
        # `at_start`: the next token begins a text (e.g. it follows BOS), so a SentencePiece
        # vocabulary's leading space is dropped; False when continuing a prompt's text.
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._pending = b""
        self._at_start = at_start

    def push(self, token_id: int) -> str:
        tokenizer = self._tokenizer
        if tokenizer.is_special(token_id):
            if self._skip_special_tokens:
                return ""
            piece = tokenizer.token_bytes(token_id)
        else:
            piece = tokenizer.token_bytes(token_id)
            if not tokenizer.keeps_text_start(token_id):
                if self._at_start and tokenizer.strips_leading_space and piece.startswith(b" "):
                    piece = piece[1:]
                self._at_start = False
        self._pending += piece
        return self._release()

    def push_many(self, ids: list[int]) -> str:
        return "".join(self.push(token_id) for token_id in ids)

    def flush(self) -> str:
        text = self._pending.decode("utf-8", errors="replace")
        self._pending = b""
        return text

    def _release(self) -> str:
        data = self._pending
        cut = _complete_prefix_length(data)
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")


def _complete_prefix_length(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    # Look back at most 3 bytes for the lead byte of an unfinished multi-byte character.
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: keep looking for its lead
        if byte >= 0xC0:
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) - back if back < needed else len(data)
        return len(data)
    return len(data)
