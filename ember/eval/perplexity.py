"""Perplexity of a text under a model: exp of the mean negative log-likelihood, one window."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.engine.llm_engine import LLMEngine
from ember.engine.outputs import OutputAccumulator
from ember.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    num_tokens: int
    mean_nll: float


def perplexity(engine: LLMEngine, text: str, max_tokens: int) -> PerplexityResult:
    """Score the first `max_tokens` tokens of `text` (BOS first when the model adds one).

    Every token after the first is predicted from all tokens before it, in one window, as
    llama.cpp's perplexity does when the window covers the text.
    """
    if engine.tokenizer is None:
        raise ValueError("perplexity needs a tokenizer; pass --tokenizer PATH")
    if max_tokens < 2:
        raise ValueError("--max-tokens must be at least 2")
    token_ids = engine.tokenizer.encode(text, add_special_tokens=True)[:max_tokens]
    if len(token_ids) < 2:
        raise ValueError("the text is too short: it needs at least two tokens")
    engine.add_request("perplexity", token_ids, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    accumulator = OutputAccumulator("perplexity", 1)
    while engine.has_unfinished_requests():
        for output in engine.step():
            accumulator.add(output)
    positions = accumulator.result().prompt_logprobs or []
    nll = [-position[token].logprob for token, position in zip(token_ids[1:], positions[1:], strict=True)]
    mean = sum(nll) / len(nll)
    return PerplexityResult(perplexity=math.exp(mean), num_tokens=len(token_ids), mean_nll=mean)
