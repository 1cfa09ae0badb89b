"""Graceful shutdown: stop admitting, let running requests finish within a grace period, end the rest cleanly.

On the first SIGTERM (or Ctrl+C) the server keeps listening but answers every new request,
`/health` included, 503 + Retry-After, so a load balancer moves traffic elsewhere. Requests
already running go on. When none is left, or the grace period ends, the streams still open get
one error event (`code: server_shutting_down`) and `data: [DONE]`, whole-answer requests get a
503, and only then does the HTTP server close. A second signal cuts the grace period short: the
streams still open end the same way at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import TypeVar

from ember.server.common.admission import AdmissionGate
from ember.server.common.errors import ApiError

logger = logging.getLogger("ember.server")

T = TypeVar("T")

# After the grace period, how long the ended streams get to send their last events.
FLUSH_S = 5.0
POLL_S = 0.05


class Drain:
    """The shutdown state of one app: the requests in flight and when their grace period ends."""

    def __init__(self, gate: AdmissionGate, grace_s: float, retry_after_s: int) -> None:
        self._gate = gate
        self._grace_s = grace_s
        self._retry_after_s = retry_after_s
        self._expired: asyncio.Event | None = None
        self._waiting: set[asyncio.Task] = set()  # streams waiting for their next item
        self.is_cut_short = False  # a plain flag: set from a signal handler, polled by the drain

    @property
    def is_draining(self) -> bool:
        return self._gate.is_draining

    def shutdown_error(self) -> ApiError:
        """What a request still running when the grace period ends is told."""
        return ApiError(
            "The server is shutting down and ended this request before it finished. Retry it "
            f"after {self._retry_after_s} s (on another replica if there is one).",
            status_code=HTTPStatus.SERVICE_UNAVAILABLE,
            error_type="server_error",
            code="server_shutting_down",
            headers={"Retry-After": str(self._retry_after_s)},
        )

    def start(self) -> None:
        """Refuse new requests from now on (safe to call from a signal handler)."""
        self._gate.start_draining()

    def cut_short(self) -> None:
        """End the grace period now: the running drain ends the requests left at its next poll (signal-safe)."""
        self.is_cut_short = True

    async def run(self) -> None:
        """Drain: stop admitting, wait for running requests up to the grace period, then end the rest."""
        self.start()
        logger.info(
            "draining: %d requests in flight, grace period %.1f s; new requests get 503",
            self._gate.num_in_flight,
            self._grace_s,
        )
        await self._wait_idle(self._grace_s, stops_when_cut_short=True)
        if self._gate.num_in_flight:
            logger.warning("grace period %s: ending %d requests still running",
                           "cut short by a second signal" if self.is_cut_short else "over", self._gate.num_in_flight)
        self._expire()
        await self._wait_idle(FLUSH_S)

    async def _wait_idle(self, timeout_s: float, stops_when_cut_short: bool = False) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._gate.num_in_flight and asyncio.get_running_loop().time() < deadline:
            if stops_when_cut_short and self.is_cut_short:
                return
            await asyncio.sleep(POLL_S)

    def _expired_event(self) -> asyncio.Event:
        if self._expired is None:
            self._expired = asyncio.Event()
        return self._expired

    def _expire(self) -> None:
        self._expired_event().set()
        for task in self._waiting:
            task.cancel()

    async def until_expired(self, events: AsyncIterator[T]) -> AsyncIterator[T]:
        """The items of `events`, until the grace period ends (then the shutdown ApiError is raised).

        A stream waiting for its next item when the grace period ends is cancelled there (so `events`
        is closed by the cancellation); one between items stops before asking for the next. Costs
        nothing per item: no helper task, no wait on two futures.
        """
        task = asyncio.current_task()
        while True:
            if self._expired_event().is_set():
                raise self.shutdown_error()
            self._waiting.add(task)
            try:
                item = await anext(events)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                # A stream cancelled while waiting after the grace period ended was waiting when it ended, so
                # `_expire` cancelled it too: withdraw that, and if nothing else asked, end with the shutdown error.
                if self._expired_event().is_set() and _uncancel(task) == 0:
                    raise self.shutdown_error() from None
                raise
            finally:
                self._waiting.discard(task)
            yield item

    async def run_until_expired(self, work: Awaitable[T], on_tick: Callable[[], Awaitable[None]], tick_s: float) -> T:
        """Await `work`, calling `on_tick` every `tick_s`; cancel it if the grace period ends first."""
        task = asyncio.ensure_future(work)
        expired = asyncio.ensure_future(self._expired_event().wait())
        try:
            while True:
                await asyncio.wait({task, expired}, timeout=tick_s, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    return task.result()
                if expired.done():
                    raise self.shutdown_error()
                await on_tick()
        finally:
            expired.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


def _uncancel(task: asyncio.Task) -> int:
    """Withdraw one cancellation request of `task`; the requests left (Python 3.10 does not count them: 0)."""
    withdraw = getattr(task, "uncancel", None)  # added in Python 3.11
    return withdraw() if withdraw is not None else 0
