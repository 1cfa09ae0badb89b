"""A bounded waiting room: how many requests may wait for their first token at once."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from ember.server.errors import ApiError


class AdmissionTicket:
    """One admitted HTTP request holding `count` waiting slots (one per engine request).

    Each engine request gives its slot back at its first token (`mark_started`) or when it
    ends (`release`), whichever comes first; both are idempotent per slot.
    """

    def __init__(self, gate: AdmissionGate, count: int) -> None:
        self._gate = gate
        self._held = count

    def mark_started(self) -> None:
        """One engine request got its first token: it no longer waits."""
        if self._held > 0:
            self._held -= 1
            self._gate._num_waiting -= 1

    def release(self) -> None:
        """Give back every slot still held (the request ended or failed)."""
        self._gate._num_waiting -= self._held
        self._held = 0


class AdmissionGate:
    """Admits requests while fewer than `max_waiting` wait; answers 503 + Retry-After beyond that.

    Used from the event loop only, so its counter needs no lock.
    """

    def __init__(self, max_waiting: int, retry_after_s: int, on_reject: Callable[[], None]) -> None:
        self._max_waiting = max_waiting
        self._retry_after_s = retry_after_s
        self._on_reject = on_reject
        self._num_waiting = 0

    @property
    def num_waiting(self) -> int:
        """Engine requests admitted that have not produced their first token."""
        return self._num_waiting

    def admit(self, count: int) -> AdmissionTicket:
        """A ticket for `count` engine requests, or a 503 ApiError when the waiting room is full."""
        if self._num_waiting + count > self._max_waiting:
            self._on_reject()
            raise ApiError(
                f"The server is overloaded: {self._num_waiting} requests are already waiting "
                f"(limit {self._max_waiting}). Retry after {self._retry_after_s} s.",
                status_code=HTTPStatus.SERVICE_UNAVAILABLE,
                error_type="server_overloaded",
                code="server_overloaded",
                headers={"Retry-After": str(self._retry_after_s)},
            )
        self._num_waiting += count
        return AdmissionTicket(self, count)
