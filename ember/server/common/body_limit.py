"""ASGI middleware bounding request bodies: 413 past a size limit, 408 past a read deadline."""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ember.server.common.errors import ApiError

logger = logging.getLogger("ember.server")


class BodyLimits:
    """Answers 413 when Content-Length, or the bytes actually received, exceed `max_body_bytes`,
    and 408 when the whole body has not arrived `body_timeout_s` after the app first asks for it.

    Both errors are raised from `receive()`, so the app's ApiError handler turns them into the
    response. Once the body is complete, `receive()` is left alone: a streaming response waits
    on it for the client's disconnect for as long as it streams.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float) -> None:
        self._app = app
        self._max_body_bytes = max_body_bytes
        self._body_timeout_s = body_timeout_s

    def _too_large(self) -> ApiError:
        return ApiError(
            f"The request body is larger than this server's limit of {self._max_body_bytes} bytes.",
            status_code=HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            code="request_too_large",
        )

    def _too_slow(self) -> ApiError:
        return ApiError(
            f"The request body did not arrive within {self._body_timeout_s:g} s. Send it faster, or "
            "ask the operator to raise --body-timeout-s.",
            status_code=HTTPStatus.REQUEST_TIMEOUT,
            code="request_timeout",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        received = 0
        is_complete = False
        deadline: float | None = None

        async def bounded_receive() -> Message:
            nonlocal received, is_complete, deadline
            if is_complete:
                return await receive()
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self._body_timeout_s
            try:
                message = await asyncio.wait_for(receive(), timeout=max(deadline - loop.time(), 0.0))
            except TimeoutError:
                logger.info("client too slow sending %s %s: 408", scope.get("method"), scope.get("path"))
                raise self._too_slow() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max_body_bytes:
                    raise self._too_large()
                is_complete = not message.get("more_body", False)
            else:
                is_complete = True
            return message

        await self._app(scope, bounded_receive, send)
