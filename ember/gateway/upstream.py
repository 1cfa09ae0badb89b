"""Talking to one backend over HTTP: OpenAI-compatible requests, responses and SSE streams.

An upstream either answers (a JSON body, or an iterator of OpenAI stream chunks) or raises
`UpstreamError`, which says whether another backend may be tried (connection errors, timeouts,
429 and 5xx) or the client's request itself was refused (other 4xx, passed through as is).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Protocol

import httpx

from ember.gateway.config import BackendConfig
from ember.gateway.responses import RESPONSES_ENDPOINT, is_final_event

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class UpstreamError(Exception):
    """A backend did not serve the request. `is_retryable`: another attempt might succeed."""

    def __init__(self, message: str, *, is_retryable: bool, status_code: int = 502, body: dict | None = None) -> None:
        super().__init__(message)
        self.is_retryable = is_retryable
        self.status_code = status_code
        self.body = body


class Upstream(Protocol):
    """What the dispatcher needs from a backend, whatever wire format it speaks."""

    config: BackendConfig

    def serves(self, endpoint: str) -> bool:
        """Whether this backend has `endpoint` at all (routing passes over those that have not)."""

    async def complete(self, endpoint: str, body: dict) -> dict:
        """The JSON response to a non-streamed request, in OpenAI format."""

    def stream(self, endpoint: str, body: dict) -> AsyncIterator[dict]:
        """The OpenAI-format chunks (Responses API events for /responses) of a streamed request."""

    async def relay(self, method: str, path: str, params: dict[str, str]) -> tuple[int, dict]:
        """A bodiless request passed on as it is (reads of a stored response): the status and JSON body."""


def backend_timeout(config: BackendConfig) -> httpx.Timeout:
    """Connect fast, then allow `timeout_s` between bytes."""
    return httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)


def error_from_response(backend: str, status_code: int, text: str) -> UpstreamError:
    """The UpstreamError for a non-2xx answer, keeping an OpenAI error body when there is one."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
        body = None
    return UpstreamError(
        f"backend {backend} answered {status_code}",
        is_retryable=status_code in RETRYABLE_STATUS,
        status_code=status_code,
        body=body,
    )


def transport_error(backend: str, error: Exception) -> UpstreamError:
    """A connection failure or timeout: always worth trying elsewhere."""
    kind = "timed out" if isinstance(error, httpx.TimeoutException) else "unreachable"
    return UpstreamError(f"backend {backend} {kind}: {type(error).__name__}", is_retryable=True, status_code=502)


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-events body, in order."""
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            yield line[5:].strip()


class OpenAIUpstream:
    """An OpenAI-compatible server (ember serve, vLLM, OpenAI itself): requests pass unchanged."""

    def __init__(self, config: BackendConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self._client = client
        self._base = config.url.rstrip("/")
        self._headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    def serves(self, endpoint: str) -> bool:
        return True

    async def complete(self, endpoint: str, body: dict) -> dict:
        try:
            response = await self._client.post(
                self._base + endpoint, json=body, headers=self._headers, timeout=backend_timeout(self.config)
            )
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        if response.status_code != 200:
            raise error_from_response(self.config.name, response.status_code, response.text)
        return response.json()

    async def stream(self, endpoint: str, body: dict) -> AsyncIterator[dict]:
        """The stream's chunks up to `[DONE]`, or to the end of the body after a Responses API
        final event (OpenAI sends no `[DONE]` there); any other end is a failure."""
        body = self._stream_body(endpoint, body)
        request = self._client.build_request(
            "POST", self._base + endpoint, json=body, headers=self._headers, timeout=backend_timeout(self.config)
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        try:
            if response.status_code != 200:
                await response.aread()
                raise error_from_response(self.config.name, response.status_code, response.text)
            has_ended = False
            async for data in sse_data(response):
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                has_ended = is_final_event(chunk)
                yield chunk
            if not has_ended:
                raise UpstreamError(f"backend {self.config.name} ended its stream before [DONE]", is_retryable=True)
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        finally:
            await response.aclose()

    async def relay(self, method: str, path: str, params: dict[str, str]) -> tuple[int, dict]:
        """A bodiless request (`GET` / `DELETE` of a stored response) passed on: the backend's status and JSON body."""
        try:
            response = await self._client.request(method, self._base + path, params=params, headers=self._headers,
                                                  timeout=backend_timeout(self.config))  # fmt: skip
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        try:
            return response.status_code, response.json()
        except ValueError:
            raise error_from_response(self.config.name, response.status_code, response.text) from None

    def _stream_body(self, endpoint: str, body: dict) -> dict:
        """Streams always ask for usage: on the last chunk, and with `continuous_usage` on every
        chunk. The Responses API's final event carries usage anyway, and its servers refuse
        `stream_options`."""
        if endpoint == RESPONSES_ENDPOINT:
            return {**body, "stream": True}
        options = {"include_usage": True}
        if self.config.continuous_usage:
            options["continuous_usage_stats"] = True
        return {**body, "stream": True, "stream_options": options}
