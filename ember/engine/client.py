"""EngineClient: what a server needs of an engine, whether it runs in this process or another."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ember.engine.engine_request import EngineRequest
from ember.engine.limits import RequestLimits
from ember.engine.llm_engine import EngineStats, StepRecord
from ember.engine.outputs import RequestOutput
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
    limits: RequestLimits

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Check `request` now (RequestRejected naming the field, EngineDeadError when the engine has stopped),
        then stream its deltas: it is handed to the engine at the first read; the last delta has `finished=True`;
        leaving early aborts it. EngineDeadError during the stream when the engine stops."""
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


@dataclass(frozen=True)
class ReplicaHealth:
    """One replica of a data-parallel engine as /health shows it: up, or down with why (and whether it is coming
    back), how often it was restarted, its process id while up."""

    replica: str
    is_up: bool
    is_restarting: bool
    reason: str | None
    restarts: int
    pid: int | None


@runtime_checkable
class ReplicatedEngineClient(EngineClient, Protocol):
    """An EngineClient over several engine replicas (`ember.engine.data_parallel`): the server labels the metrics of
    each replica and shows each one's health."""

    def replica_stats(self) -> dict[str, EngineStats]:
        """Each live replica's stats, by replica name."""
        ...

    def replica_health(self) -> list[ReplicaHealth]:
        """Every replica, up or not."""
        ...
