"""Which tokens of a vocabulary may come next under a JSON constraint, and a per-sequence guide through it.

A token is allowed when the recogniser can read all its bytes from the current states. The vocabulary
is a byte trie walked once per distinct set of states (pruned at the first byte no state can read), and
the answer is cached: a constrained generation revisits the same few states (inside a string, after a
comma, ...) over and over. Inside a string's body (between characters) every token without a quote,
backslash or control byte that is valid UTF-8 from a character's start is allowed whatever encloses the
string, so those tokens come from one precomputed mask and only the others are walked.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ember.engine.structured.json_bounds import counts_as_character
from ember.engine.structured.json_recognizer import UTF8_LEADS, JsonRecognizer, State
from ember.tokenizers.base import Tokenizer

MASK_CACHE_ENTRIES = 256  # per constraint; at most a vocabulary's bytes each (dense) and mostly a few hundred ids
DENSE_FRACTION = 8  # a state allowing over 1/8 of the vocabulary keeps a boolean mask instead of ids
STEP_MEMO_ENTRIES = 200_000
MAX_TOKEN_CHARACTERS = 4096  # room at least this large: every plain token fits
BOUNDED_ROOM_MASKS = 64
MAX_FORCED_BYTES = 256  # forced text read per jump-forward (the rest is forced again after it)  # plain-token masks kept per vocabulary for strings with a maxLength

States = frozenset[State]


# A trie node is a dict: byte -> child node, and TOKEN_IDS -> the ids of the tokens spelled by the path
# to it (plain dicts: a 150K vocabulary's trie has about a million nodes, built at the first request).
TrieNode = dict
TOKEN_IDS = -1
NOT_PLAIN_STRING_TEXT = bytes(range(0x20)) + b'"\\'  # bytes that end, escape or break a string's body


def _insert(root: TrieNode, data: bytes, token_id: int) -> None:
    node = root
    for byte in data:
        node = node.setdefault(byte, {})
    node.setdefault(TOKEN_IDS, []).append(token_id)


def _is_utf8_from_a_boundary(data: bytes) -> bool:
    """Whether `data` is whole UTF-8 characters, perhaps ending in the start of one: what a string's body may take
    anywhere between characters (a token that starts mid-character is read byte by byte instead)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        tail = data[cut:]
        return not tail or _is_character_start(tail)
    return False


def _is_character_start(tail: bytes) -> bool:
    """Whether `tail` (1-3 bytes) begins some UTF-8 character without completing it."""
    lead = UTF8_LEADS.get(tail[0])
    if lead is None or len(tail) > lead[1]:
        return False
    _, _, low, high = lead
    return all(low <= byte <= high if i == 0 else 0x80 <= byte <= 0xBF for i, byte in enumerate(tail[1:]))


class Vocabulary:
    """A tokenizer's non-special tokens as bytes, in the tries the mask walks; built once per engine."""

    def __init__(self, tokenizer: Tokenizer, size: int) -> None:
        """`size`: the model's logit count (it may exceed the tokenizer's; those ids are never allowed)."""
        self.size = size
        self.eos_ids = tuple(sorted(t for t in tokenizer.eos_ids if t < size))
        self.token_bytes: list[bytes | None] = [None] * size
        self.trie: TrieNode = {}
        self.escaping_trie: TrieNode = {}  # tokens that are not plain string text
        plain, characters = [], []
        for token_id in range(min(size, tokenizer.vocab_size)):
            if tokenizer.is_special(token_id) or not tokenizer.has_token(token_id):  # a gap in the vocabulary: never allowed
                continue
            data = tokenizer.token_bytes(token_id)
            if not data:
                continue
            self.token_bytes[token_id] = data
            _insert(self.trie, data, token_id)
            if len(data.translate(None, NOT_PLAIN_STRING_TEXT)) == len(data) and _is_utf8_from_a_boundary(data):
                plain.append(token_id)
                characters.append(sum(map(counts_as_character, data)))
            else:
                _insert(self.escaping_trie, data, token_id)
        self.not_plain_string_tokens = torch.ones(size, dtype=torch.bool)
        self.not_plain_string_tokens[plain] = False
        self._plain_characters = torch.full((size,), sys.maxsize, dtype=torch.long)
        self._plain_characters[plain] = torch.tensor(characters, dtype=torch.long)
        self._plain_within: OrderedDict[int, torch.Tensor] = OrderedDict()

    def blocked_in_string_body(self, room: int) -> torch.Tensor:
        """Every token but the plain-text ones of at most `room` characters (all of them: an unbounded string)."""
        if room >= MAX_TOKEN_CHARACTERS:
            return self.not_plain_string_tokens
        mask = self._plain_within.get(room)
        if mask is None:
            mask = self._plain_within[room] = self._plain_characters > room
            if len(self._plain_within) > BOUNDED_ROOM_MASKS:
                self._plain_within.popitem(last=False)
        return mask


@dataclass(frozen=True)
class TokenMask:
    """The tokens allowed next: `token_ids`, plus every token `blocked` leaves out (inside a string's body
    the vocabulary's shared mask of non-plain-text tokens; a state allowing many tokens has its own; None:
    every token is blocked but `token_ids`)."""

    token_ids: torch.Tensor  # int64
    blocked: torch.Tensor | None = None  # bool [vocab]

    def apply(self, logits: torch.Tensor) -> None:
        """Set every disallowed token's logit in the row `logits` to -inf, in place."""
        kept = logits[self.token_ids]
        if self.blocked is None:
            logits.fill_(float("-inf"))
        else:
            logits.masked_fill_(self.blocked, float("-inf"))
        logits[self.token_ids] = kept


class TokenGrammar:
    """One JSON constraint over one vocabulary: allowed-token masks per set of states, and token steps."""

    def __init__(self, recognizer: JsonRecognizer, vocabulary: Vocabulary) -> None:
        self.recognizer = recognizer
        self.vocabulary = vocabulary
        self._masks: OrderedDict[States, TokenMask] = OrderedDict()
        self._steps: dict[tuple[States, int], States] = {}

    def allowed(self, states: States) -> TokenMask:
        """The tokens that may follow `states`; end-of-sequence where the value may end (or nothing else can follow)."""
        mask = self._masks.get(states)
        if mask is None:
            mask = self._build(states)
            self._masks[states] = mask
            if len(self._masks) > MASK_CACHE_ENTRIES:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(states)
        return mask

    def hold(self, logits: torch.Tensor, states: States, is_greedy: bool) -> None:
        """Set the logits of tokens that may not follow `states` to -inf, in the row `logits`, in place. A greedy
        row whose best token may follow is left alone: holding it would not change its argmax, and states met
        for the first time then build no mask."""
        if not (is_greedy and self.allows(states, int(logits.argmax()))):
            self.allowed(states).apply(logits)

    def allows(self, states: States, token_id: int) -> bool:
        """Whether `token_id` may follow `states` (as `allowed` would say, without building the mask)."""
        if token_id in self.vocabulary.eos_ids:
            return self.recognizer.may_end(states)
        return bool(self.advance(states, token_id))

    def forced_tokens(self, states: States) -> list[int]:
        """Tokens spelling the text `states` force (one byte possible at a time, the value unable to end), matched
        longest first in the vocabulary's trie, as xgrammar does: a last token that a longer token extends is left to
        the model (it may go on past the forced text)."""
        data = bytearray()
        while len(data) < MAX_FORCED_BYTES:
            byte = self._only_next_byte(states)
            if byte is None:
                break
            data.append(byte)
            states = self._step(states, byte)
        tokens: list[int] = []
        start = 0
        while start < len(data):
            node, longest = self.vocabulary.trie, None
            for end in range(start, len(data)):
                node = node.get(data[end])
                if node is None:
                    break
                if TOKEN_IDS in node:
                    longest = (end + 1, node[TOKEN_IDS][0], node)
            if longest is None:
                break
            start, token_id, node = longest
            if start == len(data) and len(node) > 1:  # a longer token spells these bytes and more
                break
            tokens.append(token_id)
        return tokens

    def _only_next_byte(self, states: States) -> int | None:
        """The one byte that may follow `states`, where the value may not end there (None: none, or several)."""
        if self.recognizer.may_end(states):
            return None
        found = None
        for byte in range(256):
            if self._step(states, byte):
                if found is not None:
                    return None
                found = byte
        return found

    def advance(self, states: States, token_id: int) -> States:
        """The states after reading `token_id` (empty when it cannot follow, e.g. a special token)."""
        data = self.vocabulary.token_bytes[token_id] if 0 <= token_id < self.vocabulary.size else None
        if data is None:
            return frozenset()
        for byte in data:
            states = self._step(states, byte)
            if not states:
                break
        return states

    def _build(self, states: States) -> TokenMask:
        vocabulary = self.vocabulary
        room = self.recognizer.string_body_room(states)
        in_string = room is not None
        ids = self._walk(vocabulary.escaping_trie if in_string else vocabulary.trie, states)
        if self.recognizer.may_end(states) or (not ids and not in_string):
            ids.extend(vocabulary.eos_ids)
        blocked = vocabulary.blocked_in_string_body(room) if in_string else None
        if len(ids) * DENSE_FRACTION > vocabulary.size:  # many ids (a pattern's string): a mask is smaller
            blocked = torch.ones(vocabulary.size, dtype=torch.bool) if blocked is None else blocked.clone()
            blocked[ids] = False
            ids = []
        return TokenMask(torch.tensor(sorted(ids), dtype=torch.long), blocked)

    def _walk(self, root: TrieNode, states: States) -> list[int]:
        """Ids of every token in the trie under `root` whose bytes the recogniser reads from `states`."""
        found: list[int] = []
        pending = [(root, states)]
        while pending:
            node, at = pending.pop()
            for byte, child in node.items():
                if byte == TOKEN_IDS:
                    continue
                following = self._step(at, byte)
                if following:
                    found.extend(child.get(TOKEN_IDS, ()))
                    pending.append((child, following))
        return found

    def _step(self, states: States, byte: int) -> States:
        key = (states, byte)
        following = self._steps.get(key)
        if following is None:
            if len(self._steps) >= STEP_MEMO_ENTRIES:
                self._steps.clear()
            following = self._steps[key] = self.recognizer.step(states, byte)
        return following


class JsonGuide:
    """One sequence's place in its JSON constraint: what may come next, and whether the value is finished."""

    def __init__(self, grammar: TokenGrammar) -> None:
        self.grammar = grammar
        self.states = grammar.recognizer.initial

    def hold(self, logits: torch.Tensor, is_greedy: bool) -> None:
        """The row `logits` held to what may come next (`TokenGrammar.hold`)."""
        self.grammar.hold(logits, self.states, is_greedy)

    def prepare_mask(self) -> None:
        """Build (or find cached) the mask of the current states: the runner calls it on the mask thread while the
        forward pass runs, so `hold` finds it ready."""
        if self.states:
            self.grammar.allowed(self.states)

    def advance(self, token_id: int) -> None:
        self.states = self.grammar.advance(self.states, token_id)

    def forced_tokens(self) -> list[int]:
        """Tokens spelling the text the constraint forces from here (jump-forward; `TokenGrammar.forced_tokens`)."""
        return self.grammar.forced_tokens(self.states) if self.states else []

    def hold_drafts(self, logits: torch.Tensor, draft_ids: list[int], is_greedy: bool) -> torch.Tensor:
        """`logits` [len(draft_ids) + 1, vocab] with row i held to the state after the first i drafts, for
        verification. Rows after a draft the constraint cannot read stay as they are: verification rejects
        that draft (its target probability is 0), so they are never used."""
        held = logits.float().clone()
        states = self.states
        for row, draft in enumerate([*draft_ids, None]):
            self.grammar.hold(held[row], states, is_greedy)
            if draft is None:
                break
            states = self.grammar.advance(states, draft)
            if not states:
                break
        return held

    @property
    def is_finished(self) -> bool:
        """Nothing more may follow: the output is complete, or no token can continue it (a special token was read)."""
        return not self.states or self.grammar.recognizer.is_complete(self.states)
