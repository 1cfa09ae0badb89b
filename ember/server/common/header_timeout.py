"""uvicorn's HTTP/1.1 protocol with a deadline on request headers, so slow clients cannot hold connections.

uvicorn closes a keep-alive connection that stays silent, but a client that trickles header
bytes (or opens a connection and sends nothing) keeps it forever. Here a connection has
`header_timeout_s` to finish a request's headers, counted from when it opens or from the end of
its previous response; the body's own deadline is `BodyLimits`'.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("ember.server")


class HeaderDeadlineProtocol(H11Protocol):
    """H11Protocol that closes a connection whose next request's headers are late."""

    def __init__(self, *args, header_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_deadline: asyncio.TimerHandle | None = None
        self._cycle_at_deadline: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._cycle_at_deadline = self.cycle
        self._header_deadline = self.loop.call_later(self._header_timeout_s, self._on_header_deadline)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_header_deadline(self) -> None:
        self._header_deadline = None
        # A request whose headers arrived since the deadline was set made a new cycle: leave it be.
        is_between_requests = self.cycle is None or self.cycle.response_complete
        if self.cycle is self._cycle_at_deadline and is_between_requests and not self.transport.is_closing():
            logger.info("closing a connection that sent no complete request headers in %g s", self._header_timeout_s)
            self.transport.close()
