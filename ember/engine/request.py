"""Requests and their sequences: what the scheduler moves between queues and the runner computes."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from ember.engine.engine_request import EngineRequest
from ember.engine.outputs import PositionLogprobs, RequestMetrics
from ember.engine.sampling_params import SamplingParams
from ember.engine.structured.structured_outputs import Guide
from ember.tokenizers.base import IncrementalDecoder, Tokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """One user request in the scheduler: what was asked (`asked`, the EngineRequest, whole) and its
    state: its `n` sequences once forked, its metrics, its prompt logprobs."""

    asked: EngineRequest
    arrival_index: int = 0
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.monotonic()))
    sequences: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    has_reported_prompt: bool = False
    bad_word_ids: tuple[tuple[int, ...], ...] = ()  # params.bad_words as token sequences (ember.engine.bad_words)
    embedding: list[float] | None = None  # an `embed` request's pooled prompt, once computed
    # What the scheduler and runner read of `asked` on every step, as plain attributes (not properties through it).
    request_id: str = field(init=False)
    prompt_token_ids: list[int] = field(init=False)
    params: SamplingParams = field(init=False)
    priority: int = field(init=False)
    cache_keys: tuple = field(init=False)

    def __post_init__(self) -> None:
        self.request_id = self.asked.request_id
        self.prompt_token_ids = self.asked.prompt_token_ids
        self.params = self.asked.params
        self.priority = self.asked.priority
        self.cache_keys = self.asked.cache_keys

    @property
    def finished(self) -> bool:
        return len(self.sequences) == self.params.n and all(s.is_finished for s in self.sequences)


@dataclass(eq=False)
class Sequence:
    """One token stream: the prompt plus what it has generated so far.

    `num_computed_tokens` counts tokens whose KV is in the cache. A sequence that still has to
    fork its siblings (`fork_pending`) computes the prompt minus its last token, then forks:
    every sibling computes that last token itself, which is where copy-on-write happens.
    """

    seq_id: str
    request: Request
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    generator: torch.Generator | None = None
    decoder: IncrementalDecoder | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    fork_pending: bool = False
    text: str = ""  # decoded output text; a possible stop-string start is held back from emission
    num_emitted_chars: int = 0
    num_emitted_tokens: int = 0
    pending_logprobs: list[PositionLogprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    guide: Guide | None = None  # the output's constraint (JSON, regex, choice, grammar), when the request has one

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def compute_target(self) -> int:
        """How many tokens must be in the cache before this sequence samples (or forks)."""
        return self.num_prompt_tokens - 1 if self.fork_pending else len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.compute_target - self.num_computed_tokens

    def samples_after(self, num_new_tokens: int) -> bool:
        """Whether computing `num_new_tokens` more reaches the end, so the step samples a token."""
        return not self.fork_pending and self.num_computed_tokens + num_new_tokens == len(self.token_ids)


def make_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator()
    generator.manual_seed(seed % 2**63)
    return generator


def make_sequence(
    request: Request, index: int, tokenizer: Tokenizer | None, token_ids: list[int], guide: Guide | None = None
) -> Sequence:
    """Sequence `index` of a request, with its own seeded stream (seed + index), decoder and output guide."""
    seed = request.params.seed
    decoder = None
    if tokenizer is not None:
        prompt = request.prompt_token_ids
        at_start = not prompt or prompt[-1] == tokenizer.bos_id
        decoder = IncrementalDecoder(tokenizer, request.params.skip_special_tokens, at_start=at_start)
    return Sequence(
        seq_id=f"{request.request_id}#{index}",
        request=request,
        index=index,
        token_ids=list(token_ids),
        num_prompt_tokens=len(request.prompt_token_ids),
        generator=make_generator(None if seed is None else seed + index),
        decoder=decoder,
        guide=guide,
    )
