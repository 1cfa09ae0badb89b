"""What the engine hands back: per-step deltas of each request, and their accumulation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """Log probability of one token, its rank in the distribution (1 = most likely), its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


# One position's logprobs: the chosen token first, then the top alternatives, keyed by token id.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One of a request's `n` completions.

    In a step delta, `text`, `token_ids` and `logprobs` hold only what is new since the
    previous delta of this completion; once accumulated they hold everything so far.
    `finish_reason` is None while running, then "stop", "length" or "abort".
    `stop_reason` is the stop string or stop token id that ended it, if any.
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Timestamps (time.monotonic seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """A request's progress: a delta per engine step, or the accumulated whole.

    `outputs` holds the completions that changed in this step (in a delta) or all of them
    (accumulated). `num_cached_tokens` counts prompt tokens served from the prefix cache.
    """

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt: str | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    embedding: list[float] | None = None  # an `embed` request's pooled prompt (SamplingParams.embed)


class OutputAccumulator:
    """Merges a request's step deltas into the full RequestOutput a non-streaming caller wants."""

    def __init__(self, request_id: str, n: int) -> None:
        self._request_id = request_id
        self._completions = [CompletionOutput(index=i) for i in range(n)]
        self._last: RequestOutput | None = None

    def add(self, delta: RequestOutput) -> None:
        for part in delta.outputs:
            whole = self._completions[part.index]
            whole.text += part.text
            whole.token_ids.extend(part.token_ids)
            if part.logprobs is not None:
                whole.logprobs = (whole.logprobs or []) + part.logprobs
            if part.cumulative_logprob is not None:
                whole.cumulative_logprob = part.cumulative_logprob
            whole.finish_reason = part.finish_reason or whole.finish_reason
            whole.stop_reason = part.stop_reason if part.stop_reason is not None else whole.stop_reason
        self._last = delta

    def result(self) -> RequestOutput:
        if self._last is None:
            raise RuntimeError(f"request {self._request_id} produced no output")
        last = self._last
        return RequestOutput(
            request_id=self._request_id,
            prompt_token_ids=last.prompt_token_ids,
            outputs=self._completions,
            finished=last.finished,
            prompt=last.prompt,
            num_cached_tokens=last.num_cached_tokens,
            prompt_logprobs=last.prompt_logprobs,
            metrics=last.metrics,
            embedding=last.embedding,
        )
