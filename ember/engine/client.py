"""EngineClient: what a server needs of an engine, whether it runs in this process or another."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from ember.engine.llm_engine import EngineStats, StepRecord
from ember.engine.outputs import RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.tokenizers.base import Tokenizer


class EngineDeadError(RuntimeError):
    """The engine stopped (its process died or it was shut down): no request can run until a restart."""


@runtime_checkable
class EngineClient(Protocol):
    """One engine serving many concurrent requests, with continuous batching across callers.

    Implemented by `AsyncEngine` (the step loop on a thread of this process, for tests and
    embedding) and `EngineProcessClient` (the step loop on the main thread of its own process,
    what `ember serve` runs).
    """

    model_name: str
    tokenizer: Tokenizer | None
    max_model_len: int

    def validate_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise RequestRejected (a ValueError naming the parameter) if the request could never run."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's deltas; the last has `finished=True`; leaving early aborts it.

        Raises EngineDeadError (before or during the stream) when the engine has stopped.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Drop a request and free its blocks (thread-safe, idempotent)."""
        ...

    def stats(self) -> EngineStats:
        """The engine's queues, cache and counters as of its last step."""
        ...

    def step_records(self) -> list[StepRecord]:
        """The most recent steps, oldest first."""
        ...

    @property
    def dead_reason(self) -> str | None:
        """Why the engine stopped, or None while it runs."""
        ...

    def shutdown(self) -> None:
        """Stop the engine and wait for it; in-flight streams end with EngineDeadError."""
        ...
