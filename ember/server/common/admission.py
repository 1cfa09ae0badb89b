"""A bounded waiting room: how many requests may wait to be scheduled at once, and draining on shutdown."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from ember.server.common.errors import ApiError


class AdmissionTicket:
    """One admitted HTTP request holding `count` waiting-room slots (one per engine request).

    A slot is held from admission until the engine is seen running its request (`mark_started`,
    at the request's first delta) or until `release`, whichever comes first; both are idempotent
    per slot. Counting a slot until the engine answers, not until the server hands it over, is
    what holds the limit against a burst: every request admitted before the engine's next step
    still counts as waiting.
    """

    def __init__(self, gate: AdmissionGate, count: int) -> None:
        self._gate = gate
        self._held = count
        self._is_released = False

    def mark_started(self) -> None:
        """One engine request produced its first delta: the engine runs it, so it no longer waits."""
        if self._held > 0:
            self._held -= 1
            self._gate._num_held -= 1

    def release(self) -> None:
        """The request is over (answered, failed or cut): give back every slot still held."""
        if self._is_released:
            return
        self._is_released = True
        self._gate._num_held -= self._held
        self._held = 0
        self._gate._num_in_flight -= 1


class AdmissionGate:
    """Admits requests while fewer than `max_waiting` wait to be scheduled; 503 + Retry-After beyond.

    Waiting means admitted and not yet seen running: the server's own count, raised here on
    admission (synchronously, so a burst within one engine step meets the limit) and lowered by
    the engine's feedback (a request's first delta, or its end), plus the requests the engine
    preempted back into its queue after they had started (`stats().num_waiting_preempted`).
    A request in a long chunked prefill counts as waiting until its first token. What the engine's
    next step can take (`stats().num_free_seats`) is admitted beyond the limit: a burst the engine
    batches at once does not wait.

    After `start_draining` every new request gets 503 + Retry-After (the server is shutting down).
    Used from the event loop only, so its counters need no lock.
    """

    def __init__(self, engine, max_waiting: int, retry_after_s: int, on_reject: Callable[[], None]) -> None:
        self._engine = engine
        self._max_waiting = max_waiting
        self._retry_after_s = retry_after_s
        self._on_reject = on_reject
        self._num_held = 0
        self._num_in_flight = 0
        self.is_draining = False

    @property
    def num_held(self) -> int:
        """Engine requests admitted that the engine has not been seen running yet."""
        return self._num_held

    @property
    def num_in_flight(self) -> int:
        """HTTP requests admitted and not yet over."""
        return self._num_in_flight

    @property
    def num_waiting(self) -> int:
        """Engine requests not running: those admitted and not yet started, and the preempted ones."""
        return self._num_held + self._engine.stats().num_waiting_preempted

    def start_draining(self) -> None:
        """Refuse every new request from now on (shutdown has begun)."""
        self.is_draining = True

    def admit(self, count: int) -> AdmissionTicket:
        """A ticket for `count` engine requests, or a 503 ApiError when full or draining."""
        headers = {"Retry-After": str(self._retry_after_s)}
        if self.is_draining:
            raise ApiError(
                f"The server is shutting down and takes no new requests. Retry after {self._retry_after_s} s "
                "(on another replica if there is one).",
                status_code=HTTPStatus.SERVICE_UNAVAILABLE,
                error_type="server_error",
                code="server_shutting_down",
                headers=headers,
            )
        stats = self._engine.stats()
        num_waiting = self._num_held + stats.num_waiting_preempted
        if num_waiting + count > self._max_waiting + stats.num_free_seats:
            self._on_reject()
            raise ApiError(
                f"The server is overloaded: {num_waiting} requests are already waiting to be scheduled "
                f"(limit {self._max_waiting}). Retry after {self._retry_after_s} s.",
                status_code=HTTPStatus.SERVICE_UNAVAILABLE,
                error_type="server_overloaded",
                code="server_overloaded",
                headers=headers,
            )
        self._num_held += count
        self._num_in_flight += 1
        return AdmissionTicket(self, count)
