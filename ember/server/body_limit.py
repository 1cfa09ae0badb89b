"""ASGI middleware that refuses request bodies over a size limit with a 413 OpenAI error."""

from __future__ import annotations

from http import HTTPStatus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ember.server.errors import ApiError


class BodySizeLimit:
    """Answers 413 when Content-Length, or the bytes actually received, exceed `max_body_bytes`.

    A body streamed without Content-Length raises the 413 ApiError from `receive()`, which the
    app's ApiError handler turns into the response.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self._app = app
        self._max_body_bytes = max_body_bytes

    def _error(self) -> ApiError:
        return ApiError(
            f"The request body is larger than this server's limit of {self._max_body_bytes} bytes.",
            status_code=HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            await self._error().response()(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max_body_bytes:
                    raise self._error()
            return message

        await self._app(scope, counting_receive, send)
