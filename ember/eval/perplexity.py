"""Perplexity of a text under a model: exp of the mean negative log-likelihood, over one window or several."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.engine.engine_request import EngineRequest
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
    nll = token_nll(engine, "perplexity", token_ids)
    mean = sum(nll) / len(nll)
    return PerplexityResult(perplexity=math.exp(mean), num_tokens=len(token_ids), mean_nll=mean)


@dataclass(frozen=True)
class WindowedPerplexity:
    """Perplexity pooled over consecutive windows (every scored token weighs the same), and each window's."""

    perplexity: float
    num_tokens: int
    window_perplexities: tuple[float, ...]


def windowed_perplexity(engine: LLMEngine, text: str, window_tokens: int, windows: int) -> WindowedPerplexity:
    """Score the first `windows * window_tokens` tokens of `text` (BOS first when the model adds one)
    as consecutive, non-overlapping windows, each scored on its own; the NLL of every predicted
    token is pooled. Several windows make the number a mean over several stretches of text."""
    if engine.tokenizer is None:
        raise ValueError("perplexity needs a tokenizer; pass --tokenizer PATH")
    if window_tokens < 2 or windows < 1:
        raise ValueError("perplexity windows need at least two tokens each, and there must be at least one window")
    token_ids = engine.tokenizer.encode(text, add_special_tokens=True)[: window_tokens * windows]
    if len(token_ids) < window_tokens * windows:
        raise ValueError(f"the text holds {len(token_ids)} tokens, fewer than {windows} windows of {window_tokens}: "
                         "give a longer text, fewer windows or shorter ones")
    per_window = [token_nll(engine, f"perplexity-{w}", token_ids[w * window_tokens : (w + 1) * window_tokens]) for w in range(windows)]
    pooled = [v for nll in per_window for v in nll]
    return WindowedPerplexity(math.exp(sum(pooled) / len(pooled)), len(token_ids),
                              tuple(math.exp(sum(nll) / len(nll)) for nll in per_window))


def token_nll(engine: LLMEngine, request_id: str, token_ids: list[int]) -> list[float]:
    """Negative log-likelihood of every token after the first, each predicted from all tokens before it
    (one prefill with prompt logprobs; `request_id` must not be running)."""
    engine.add_request(EngineRequest(request_id, token_ids, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)))
    accumulator = OutputAccumulator(request_id, 1)
    while engine.has_unfinished_requests():
        for output in engine.step():
            accumulator.add(output)
    positions = accumulator.result().prompt_logprobs or []
    return [-position[token].logprob for token, position in zip(token_ids[1:], positions[1:], strict=True)]
