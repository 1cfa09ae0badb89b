"""The engine's constrained-output machinery: one vocabulary per backend, compiled constraints shared between requests."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

import torch

from ember.engine.structured.backend_choice import choose_backend
from ember.engine.structured.json_recognizer import MAX_WHITESPACE_RUN, JsonRecognizer
from ember.engine.structured.structured_output import StructuredOutput
from ember.engine.structured.token_masks import JsonGuide, TokenGrammar, Vocabulary
from ember.tokenizers.base import Tokenizer

CACHED_CONSTRAINTS = 8  # distinct constraints kept compiled per backend (ember's hold at most MASK_CACHE_ENTRIES masks)


class Guide(Protocol):
    """One sequence's place in its output constraint, whichever backend enforces it."""

    def prepare_mask(self) -> None:
        """Compute the next token's mask (on the mask thread, while the forward pass runs)."""

    def hold(self, logits: torch.Tensor, is_greedy: bool) -> None:
        """Set the logits of tokens that may not come next to -inf, in place."""

    def hold_drafts(self, logits: torch.Tensor, draft_ids: list[int], is_greedy: bool) -> torch.Tensor:
        """Rows of verification logits, row i held to the state after the first i drafts."""

    def advance(self, token_id: int) -> None:
        """Read the token appended to the sequence."""

    def forced_tokens(self) -> list[int]:
        """Tokens that are the only way forward from here (jump-forward), never EOS."""

    @property
    def is_finished(self) -> bool:
        """Nothing more may follow."""


class StructuredOutputs:
    """Makes a guide per constrained sequence through the backend `choose_backend` picks for the configured one.
    A backend's vocabulary is built at its first constraint (ember's tries: about a second for a 150K vocabulary),
    each constraint compiled at its first request and kept for the next ones."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, backend: str = "auto") -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self.backend = backend
        self._backends: dict[str, Any] = {}
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def guide(self, constraint: StructuredOutput | None) -> Guide | None:
        """A fresh guide for one sequence (RequestLimits.check refuses a constraint where there is no tokenizer or
        the configured backend cannot enforce it)."""
        if constraint is None:
            return None
        name = choose_backend(constraint, self.backend)
        compiled = self._compile(name, constraint)
        if name == "ember":
            return JsonGuide(compiled)
        return self._backend(name).guide(compiled)

    def grammar(self, constraint: StructuredOutput) -> TokenGrammar:
        """The constraint compiled by ember's own engine over this engine's vocabulary."""
        return self._compile("ember", constraint)

    def _compile(self, name: str, constraint: StructuredOutput) -> Any:
        key = (name, constraint.key)
        compiled = self._compiled.get(key)
        if compiled is None:
            if name == "ember":
                blanks = 0 if constraint.compact_whitespace else MAX_WHITESPACE_RUN
                compiled = TokenGrammar(JsonRecognizer(constraint.compile(), blanks), self._backend(name))
            else:
                compiled = self._backend(name).compile(constraint)
            self._compiled[key] = compiled
            if len(self._compiled) > CACHED_CONSTRAINTS * 3:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        return compiled

    def _backend(self, name: str) -> Any:
        """The backend's view of this engine's vocabulary (ember's: its tries), built at its first use."""
        backend = self._backends.get(name)
        if backend is None:
            if name == "ember":
                backend = Vocabulary(self._tokenizer, self._vocab_size)
            elif name == "xgrammar":
                from ember.engine.structured.library_backends import XGrammarBackend

                backend = XGrammarBackend(self._tokenizer, self._vocab_size)
            else:
                from ember.engine.structured.library_backends import LLGuidanceBackend

                backend = LLGuidanceBackend(self._tokenizer, self._vocab_size)
            self._backends[name] = backend
        return backend
