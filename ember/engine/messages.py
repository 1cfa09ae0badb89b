"""The messages between an engine process and its client: plain dataclasses, pickled over a pipe.

Client -> engine: AddRequest, AbortRequest, Shutdown.
Engine -> client: EngineReady once loaded (or EngineFailed), then StepOutputs after every step
that changed anything, and RequestFailed for a request the engine refused.
Deltas travel without the prompt (the client keeps it): a step's message stays small
whatever the prompt lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ember.engine.limits import RequestLimits
from ember.engine.llm_engine import EngineStats, StepRecord
from ember.engine.outputs import RequestOutput
from ember.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None
    priority: int
    cache_salt: str | None = None


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """Finish the current step, then exit."""


@dataclass(frozen=True)
class EngineReady:
    """The engine has loaded: what a client needs to tokenize and validate on its own side."""

    model_name: str
    max_model_len: int
    tokenizer_source: Path | None
    limits: RequestLimits
    stats: EngineStats


@dataclass(frozen=True)
class EngineFailed:
    """The engine could not start (bad model path, bad config): the error to raise in the client."""

    error: BaseException


@dataclass(frozen=True)
class StepOutputs:
    """One step's deltas (without their prompts), the engine's stats after it, and its record."""

    outputs: list[RequestOutput]
    stats: EngineStats
    records: list[StepRecord]


@dataclass(frozen=True)
class RequestFailed:
    """The engine refused or failed one request; the client re-raises `error` in its stream."""

    request_id: str
    error: BaseException


ToEngine = AddRequest | AbortRequest | Shutdown
FromEngine = EngineReady | EngineFailed | StepOutputs | RequestFailed
