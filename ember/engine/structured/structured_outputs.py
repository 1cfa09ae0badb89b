"""The engine's constrained-output machinery: one vocabulary, compiled constraints shared between requests."""

from __future__ import annotations

from collections import OrderedDict

from ember.engine.structured.json_recognizer import MAX_WHITESPACE_RUN, JsonRecognizer
from ember.engine.structured.structured_output import StructuredOutput
from ember.engine.structured.token_masks import JsonGuide, TokenGrammar, Vocabulary
from ember.tokenizers.base import Tokenizer

CACHED_CONSTRAINTS = 8  # distinct constraints whose masks are kept (each holds at most MASK_CACHE_ENTRIES masks)


class StructuredOutputs:
    """Makes a `JsonGuide` per constrained sequence; the vocabulary's tries are built at the first one
    (about a second for a 150K vocabulary), each constraint's masks as its states are first met."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._vocabulary: Vocabulary | None = None
        self._grammars: OrderedDict[str, TokenGrammar] = OrderedDict()

    def guide(self, constraint: StructuredOutput | None) -> JsonGuide | None:
        """A fresh guide for one sequence (RequestLimits.check refuses a constraint where there is no tokenizer)."""
        if constraint is None:
            return None
        return JsonGuide(self.grammar(constraint))

    def grammar(self, constraint: StructuredOutput) -> TokenGrammar:
        """The compiled constraint over this engine's vocabulary (shared by every request asking for it)."""
        key = constraint.key
        grammar = self._grammars.get(key)
        if grammar is None:
            if self._vocabulary is None:
                self._vocabulary = Vocabulary(self._tokenizer, self._vocab_size)
            blanks = 0 if constraint.compact_whitespace else MAX_WHITESPACE_RUN
            grammar = self._grammars[key] = TokenGrammar(JsonRecognizer(constraint.compile(), blanks), self._vocabulary)
            if len(self._grammars) > CACHED_CONSTRAINTS:
                self._grammars.popitem(last=False)
        self._grammars.move_to_end(key)
        return grammar
