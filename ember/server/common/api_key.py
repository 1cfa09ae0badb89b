"""`--api-key`: the OpenAI routes (/v1/...) answer only requests that carry one of the server's keys.

As vLLM's server: a client sends `Authorization: Bearer KEY` (the openai package does, from its api_key); a request
under /v1 without a matching key gets 401 with an OpenAI error body, before its body is read. Health, metrics,
version and the tokenizer routes stay open (load balancers and scrapers probe them), as vLLM leaves them.
"""

from __future__ import annotations

import hmac
from http import HTTPStatus

from starlette.types import ASGIApp, Receive, Scope, Send

from ember.server.common.errors import ApiError

PROTECTED_PREFIX = "/v1"


class ApiKeyGate:
    """ASGI middleware refusing /v1 requests whose bearer token is none of `keys` (compared in constant time)."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self._app = app
        self._keys = tuple(key.encode() for key in keys)

    def _allows(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or not scope["path"].startswith(PROTECTED_PREFIX):
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        presented = token.strip() if scheme.lower() == b"bearer" else b""
        return any(hmac.compare_digest(presented, key) for key in self._keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._allows(scope):
            await self._app(scope, receive, send)
            return
        refusal = ApiError(
            "Incorrect or missing API key: send the server's key as 'Authorization: Bearer KEY' (the openai "
            "package's api_key).",
            status_code=HTTPStatus.UNAUTHORIZED,
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await refusal.response()(scope, receive, send)
