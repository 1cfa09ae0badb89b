"""A bounded waiting room: how many requests may wait to be scheduled at once, and draining on shutdown."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from ember.server.errors import ApiError


class AdmissionTicket:
    """One admitted HTTP request holding `count` server-side slots (one per engine request).

    A slot is held while the server prepares its engine request (tokenizing) and given back at
    `hand_over` (from then on the engine's own queue counts it) or at `release`, whichever
    comes first; both are idempotent per slot.
    """

    def __init__(self, gate: AdmissionGate, count: int) -> None:
        self._gate = gate
        self._held = count
        self._is_released = False

    def hand_over(self) -> None:
        """One engine request went to the engine: its waiting is now the engine's to count."""
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

    Waiting means not yet scheduled by the engine: the engine's queue (`stats().num_waiting`,
    which includes preempted requests) plus the requests the server holds before handing them
    over. A request the engine is running does not wait, however long its first token takes.
    The engine's stats are a snapshot refreshed each step, so a burst arriving within one step
    can be admitted past the limit by what the engine takes in that step.

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
        """Engine requests admitted that the server has not handed to the engine yet."""
        return self._num_held

    @property
    def num_in_flight(self) -> int:
        """HTTP requests admitted and not yet over."""
        return self._num_in_flight

    @property
    def num_waiting(self) -> int:
        """Engine requests not yet scheduled: the engine's queue plus those the server holds."""
        return self._engine.stats().num_waiting + self._num_held

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
        num_waiting = self.num_waiting
        if num_waiting + count > self._max_waiting:
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
