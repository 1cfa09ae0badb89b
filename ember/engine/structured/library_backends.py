"""The xgrammar and llguidance backends: each compiles a constraint over ember's vocabulary and hands every
sequence a guide whose matcher writes a 32-bit token bitmask per step.

The vocabulary both libraries read is built from ember's own tokenizer (token bytes, special tokens, EOS ids),
never downloaded. A guide's mask for the next token is computed on the engine's mask thread while the model's
forward pass runs (`prepare_mask`, started by the runner before the forward), and read at sampling (`hold`). JSON
whitespace runs are bounded by ember's MAX_WHITESPACE_RUN in every backend, so a model cannot pad a value forever.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from ember.engine.structured.grammars import grammar_dialect
from ember.engine.structured.json_recognizer import MAX_WHITESPACE_RUN
from ember.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from ember.engine.structured.structured_output import StructuredOutput

COMPACT_SEPARATORS = (",", ":")


def vocabulary_bytes(tokenizer: Tokenizer, size: int) -> list[bytes]:
    """Each id's bytes up to the model's logit count `size`; b"" for special tokens and gaps (never allowed)."""
    data = [b""] * size
    for token_id in range(min(size, tokenizer.vocab_size)):
        if not tokenizer.is_special(token_id) and tokenizer.has_token(token_id):
            data[token_id] = tokenizer.token_bytes(token_id)
    return data


def blocked_by_bitmask(bitmask: torch.Tensor, size: int) -> torch.Tensor:
    """The bool [size] of token ids whose bit in `bitmask` (int32 [ceil(size / 32)], bit i of word w is id 32w+i) is 0."""
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return (bits == 0).flatten()[:size]


def _choice_strings(choice: tuple[str, ...]) -> str:
    """The alternatives as grammar string literals (JSON's escapes: both libraries read them)."""
    return " | ".join(json.dumps(option) for option in choice)


class BitmaskGuide(ABC):
    """One sequence's place in a library's matcher: the next token's bitmask, the token steps, forced runs for
    jump-forward, and rollback for draft verification. `prepare_mask` may run on the engine's mask thread while the
    forward pass runs; the runner waits for it before sampling, so the matcher is touched by one thread at a time."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
        self._is_mask_current = False  # the bitmask is the current state's
        self._has_failed = False  # a token the grammar cannot read was appended (a special token)

    def prepare_mask(self) -> None:
        """Compute the next token's mask (once per state; the runner calls it on the mask thread during the forward)."""
        if not self._is_mask_current and not self._has_failed:
            self._fill(self._bitmask)
            self._is_mask_current = True

    def hold(self, logits: torch.Tensor, is_greedy: bool) -> None:
        """Set the logits of tokens that may not come next to -inf in the row `logits`, in place (a greedy row whose
        argmax is allowed is left as it is: its choice would not change)."""
        self.prepare_mask()
        row = self._bitmask[0]
        if is_greedy:
            best = int(logits.argmax())
            if best < self.vocab_size and (int(row[best >> 5]) >> (best & 31)) & 1:
                return
        logits[: self.vocab_size].masked_fill_(blocked_by_bitmask(row, self.vocab_size), float("-inf"))
        logits[self.vocab_size :] = float("-inf")

    def advance(self, token_id: int) -> None:
        """Read the token appended to the sequence (a token the grammar cannot read ends it: `is_finished`)."""
        self._is_mask_current = False
        if not self._has_failed and not self._accept(token_id):
            self._has_failed = True

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar allows as the only way forward from here (jump-forward; no EOS among them)."""
        return [] if self._has_failed else self._forced()

    def hold_drafts(self, logits: torch.Tensor, draft_ids: list[int], is_greedy: bool) -> torch.Tensor:
        """`logits` [len(draft_ids) + 1, vocab] with row i held to the state after the first i drafts; the matcher
        is rolled back after (rows past a draft the grammar refuses stay as they are: verification rejects it)."""
        held = logits.float().clone()
        accepted = 0
        for row, draft in enumerate([*draft_ids, None]):
            self.hold(held[row], is_greedy)
            if draft is None or not self._accept(draft):
                break
            accepted += 1
            self._is_mask_current = False
        if accepted:
            self._rollback(accepted)
            self._is_mask_current = False
        return held

    @property
    def is_finished(self) -> bool:
        """Nothing more may follow: the grammar has ended, or a token it cannot read was appended."""
        return self._has_failed or self._is_stopped()

    @abstractmethod
    def _fill(self, bitmask: torch.Tensor) -> None: ...
    @abstractmethod
    def _accept(self, token_id: int) -> bool: ...
    @abstractmethod
    def _forced(self) -> list[int]: ...
    @abstractmethod
    def _rollback(self, num_tokens: int) -> None: ...
    @abstractmethod
    def _is_stopped(self) -> bool: ...


class XGrammarGuide(BitmaskGuide):
    """A sequence's xgrammar GrammarMatcher."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar

        super().__init__(vocab_size)
        self._matcher = xgrammar.GrammarMatcher(compiled)

    def _fill(self, bitmask: torch.Tensor) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, 0)

    def _accept(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def _forced(self) -> list[int]:
        return self._matcher.find_jump_forward_tokens()

    def _rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def _is_stopped(self) -> bool:
        """Terminated, or complete with nothing but a stop token allowed next (finished now, not one EOS step later)."""
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        self.prepare_mask()
        allowed = (~blocked_by_bitmask(self._bitmask[0], self.vocab_size)).nonzero().flatten().tolist()
        return set(allowed) <= set(self._matcher.stop_token_ids)


class LLGuidanceGuide(BitmaskGuide):
    """A sequence's llguidance LLMatcher."""

    def __init__(self, tokenizer: Any, grammar: str, vocab_size: int) -> None:
        import llguidance

        super().__init__(vocab_size)
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)

    def _fill(self, bitmask: torch.Tensor) -> None:
        from llguidance.torch import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, bitmask, 0)

    def _accept(self, token_id: int) -> bool:
        return self._matcher.consume_token(token_id)

    def _forced(self) -> list[int]:
        return self._matcher.compute_ff_tokens()

    def _rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def _is_stopped(self) -> bool:
        return self._matcher.is_stopped() or self._matcher.is_error()


class XGrammarBackend:
    """xgrammar over one engine's vocabulary: its TokenizerInfo (raw bytes from ember's tokenizer) and compiler."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import xgrammar

        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo(vocabulary_bytes(tokenizer, vocab_size), xgrammar.VocabType.RAW,
                                      vocab_size=vocab_size, stop_token_ids=sorted(tokenizer.eos_ids))  # fmt: skip
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def guide(self, compiled: Any) -> XGrammarGuide:
        """A fresh matcher for one sequence over a constraint `compile` made."""
        return XGrammarGuide(compiled, self.vocab_size)

    def compile(self, constraint: StructuredOutput) -> Any:
        """The constraint compiled over this vocabulary (the engine keeps it for the requests asking for it)."""
        compiler = self._compiler
        if constraint.grammar is not None:
            if grammar_dialect(constraint.grammar) == "ebnf":
                return compiler.compile_grammar(constraint.grammar)
            return compiler.compile_lark(constraint.grammar)
        if constraint.regex is not None:
            return compiler.compile_regex(constraint.regex)
        if constraint.choice is not None:
            return compiler.compile_grammar(f"root ::= {_choice_strings(constraint.choice)}")
        schema = {"type": "object"} if constraint.json_object else constraint.json_schema
        compact = constraint.compact_whitespace
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=not compact, strict_mode=True,
                                            separators=COMPACT_SEPARATORS if compact else None,
                                            max_whitespace_cnt=None if compact else MAX_WHITESPACE_RUN)  # fmt: skip


class _EmberTokens:
    """ember's tokenizer as llguidance's TokenizerWrapper reads one: token bytes (special tokens as 0xFF plus their
    name, llguidance's convention), EOS and BOS, and text -> ids for its forced-token tokenization: the tokenizer's own
    where its ids spell the text exactly, else (a SentencePiece tokenizer adds a leading space) llguidance's greedy
    longest-match tokenization, set once its tokenizer is built (`greedy`)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.greedy: Any = None
        probe = "Once upon a time, {\"x\": 1}"
        self._is_exact = b"".join(tokenizer.token_bytes(t) for t in tokenizer.encode(probe)) == probe.encode()
        self.eos_token_id = min(tokenizer.eos_ids) if tokenizer.eos_ids else None
        self.bos_token_id = tokenizer.bos_id
        self.tokens = vocabulary_bytes(tokenizer, vocab_size)
        self.special_token_ids = [i for i in range(min(vocab_size, tokenizer.vocab_size)) if tokenizer.is_special(i)]
        for token_id in self.special_token_ids:
            self.tokens[token_id] = b"\xff" + tokenizer.id_to_piece(token_id).encode()

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            raise TypeError("ember's tokenizer encodes text, not bytes")  # llguidance then hands it text
        if self._is_exact or self.greedy is None:
            return self._tokenizer.encode(text)
        return self.greedy(text)


class LLGuidanceBackend:
    """llguidance over one engine's vocabulary: its LLTokenizer (from ember's tokenizer) and each constraint's grammar
    text (compiled by each matcher; llguidance's lexer is lazy, so a matcher costs little)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import llguidance

        self.vocab_size = vocab_size
        tokens = _EmberTokens(tokenizer, vocab_size)
        self._tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(tokens), n_vocab=vocab_size,
                                                 eos_token=sorted(tokenizer.eos_ids))  # fmt: skip
        tokens.greedy = self._tokenizer.greedy_tokenize

    def guide(self, grammar: str) -> LLGuidanceGuide:
        """A fresh matcher for one sequence over a grammar `compile` wrote."""
        return LLGuidanceGuide(self._tokenizer, grammar, self.vocab_size)

    @staticmethod
    def compile(constraint: StructuredOutput) -> str:
        """The constraint as llguidance's grammar text."""
        import llguidance

        if constraint.grammar is not None:
            return llguidance.grammar_from("grammar", constraint.grammar)
        if constraint.regex is not None:
            return llguidance.LLMatcher.grammar_from_regex(constraint.regex)
        if constraint.choice is not None:
            return llguidance.LLMatcher.grammar_from_lark(f"start: {_choice_strings(constraint.choice)}")
        schema = {"type": "object"} if constraint.json_object else constraint.json_schema
        options: dict[str, Any] = {"whitespace_flexible": not constraint.compact_whitespace}
        if constraint.compact_whitespace:
            options.update(item_separator=COMPACT_SEPARATORS[0], key_separator=COMPACT_SEPARATORS[1])
        else:
            options.update(whitespace_pattern=f"[\\x20\\x0A\\x0D\\x09]{{1,{MAX_WHITESPACE_RUN}}}")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
