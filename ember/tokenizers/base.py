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

    Decoding skips ids that `has_token` denies, as HF `tokenizers` does: they read as nothing
    and leave the text's start alone.
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

    def has_token(self, token_id: int) -> bool:
        """Whether `token_id` names a token of this vocabulary (not past it, negative or a gap).

        A model's logits may be wider than its tokenizer's vocabulary (Qwen2.5: 151,936 logits
        for 151,665 tokens), so a sampled id may have no token: decoding must skip it rather than
        fail the request. Validating ids a user sends belongs to whoever receives them.
        """
        return 0 <= token_id < self.vocab_size

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of token `token_id`; ValueError when `has_token(token_id)` is False."""

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
        """Whether decoding this token leaves the start-of-text state alone, so the next token
        still loses its leading space. By default special tokens do (they are not text);
        sentencepiece's unknown piece does too, while `tokenizers` strips only the first token
        of the list, whatever it is."""
        return self.is_special(token_id)

    def is_run_byte(self, token_id: int) -> bool:
        """Whether this token is a byte that decodes with its run of neighbouring byte tokens, all
        or nothing: the run's bytes if they are valid UTF-8, else one U+FFFD per token (HF's
        ByteFallback decoder). Other bytes are repaired by `text_of_bytes`."""
        return False

    def text_of_bytes(self, data: bytes) -> str:
        """Decoded bytes as text, invalid UTF-8 as U+FFFD: one per maximal invalid subsequence,
        as Python, Rust's from_utf8_lossy and tiktoken replace it."""
        return data.decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


class IncrementalDecoder:
    """Turns a stream of token ids into a stream of text, never emitting broken UTF-8.

    Bytes that do not yet form a complete UTF-8 character are held back until the next
    token completes them, and a run of `is_run_byte` tokens until it ends; `flush()` releases
    what is left (invalid bytes as U+FFFD, see `Tokenizer.text_of_bytes`).
    """

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = False, at_start: bool = True
    ) -> None:
        # `at_start`: the next token begins a text (e.g. it follows BOS), so a SentencePiece
        # vocabulary's leading space is dropped; False when continuing a prompt's text.
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._pending = b""
        self._byte_run: list[bytes] = []  # `is_run_byte` tokens' bytes, until their run ends
        self._at_start = at_start

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes; "" for ids with no token (see `has_token`)."""
        tokenizer = self._tokenizer
        if not tokenizer.has_token(token_id):
            return ""
        if self._skip_special_tokens and tokenizer.is_special(token_id):
            return ""
        piece = tokenizer.token_bytes(token_id)
        if self._at_start and not tokenizer.keeps_text_start(token_id):
            if tokenizer.strips_leading_space and piece.startswith(b" "):
                piece = piece[1:]
            self._at_start = False
        if tokenizer.is_run_byte(token_id):
            self._byte_run.append(piece)
            return ""
        self._pending += self._end_byte_run() + piece
        return self._release()

    def push_many(self, ids: list[int]) -> str:
        return "".join(self.push(token_id) for token_id in ids)

    def flush(self) -> str:
        text = self._tokenizer.text_of_bytes(self._pending + self._end_byte_run())
        self._pending = b""
        return text

    def _end_byte_run(self) -> bytes:
        """The held run's bytes when they are valid UTF-8, else one U+FFFD per token."""
        if not self._byte_run:
            return b""
        run, self._byte_run = self._byte_run, []
        data = b"".join(run)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return "\ufffd".encode() * len(run)
        return data

    def _release(self) -> str:
        data = self._pending
        cut = _complete_prefix_length(data)
        self._pending = data[cut:]
        return self._tokenizer.text_of_bytes(data[:cut])


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
