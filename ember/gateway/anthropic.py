"""Anthropic Messages backends: OpenAI chat requests translated to `/v1/messages` and the
answers (JSON or the `message_start` ... `message_stop` event stream) translated back.

Mapping: system and developer messages -> `system`; `max_tokens` / `max_completion_tokens` ->
`max_tokens` (required there); `stop` -> `stop_sequences`; temperature, top_p, top_k as is.
`stop_reason` end_turn / stop_sequence -> finish_reason "stop", max_tokens -> "length";
`usage.input_tokens` / `output_tokens` -> prompt / completion tokens. Status 529 (overloaded)
is retryable like 503.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import httpx

from ember.gateway.accounting import content_text
from ember.gateway.config import BackendConfig
from ember.gateway.errors import error_body
from ember.gateway.upstream import RETRYABLE_STATUS, UpstreamError, backend_timeout, transport_error

ANTHROPIC_VERSION = "2023-06-01"
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
PASSED_FIELDS = ("temperature", "top_p", "top_k")


def to_messages_request(body: dict) -> dict:
    """The Anthropic Messages request for an OpenAI chat completion request."""
    system = [content_text(m.get("content")) for m in body.get("messages") or () if m.get("role") in ("system", "developer")]
    messages = [
        {"role": m["role"], "content": content_text(m.get("content"))}
        for m in body.get("messages") or ()
        if m.get("role") in ("user", "assistant")
    ]
    request = {"model": body["model"], "messages": messages, "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens")}
    if system:
        request["system"] = "\n\n".join(system)
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    request.update({name: body[name] for name in PASSED_FIELDS if body.get(name) is not None})
    if body.get("stream"):
        request["stream"] = True
    return request


def to_chat_completion(message: dict) -> dict:
    """The OpenAI chat completion for an Anthropic Messages response."""
    text = "".join(block.get("text", "") for block in message.get("content") or () if block.get("type") == "text")
    usage = message.get("usage") or {}
    prompt_tokens, completion_tokens = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": message.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": FINISH_REASONS.get(message.get("stop_reason"), "stop")}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }


class StreamTranslator:
    """Turns Anthropic stream events into OpenAI chat chunks, one event at a time."""

    def __init__(self) -> None:
        self._base: dict = {}
        self._prompt_tokens = 0
        self._completion_tokens = 0

    def chunks(self, event: dict) -> list[dict]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._base = {"id": message.get("id"), "object": "chat.completion.chunk", "created": int(time.time()), "model": message.get("model")}
            self._prompt_tokens = int((message.get("usage") or {}).get("input_tokens", 0))
            return [self._chunk({"role": "assistant", "content": ""}, None)]
        if kind == "content_block_delta" and (event.get("delta") or {}).get("type") == "text_delta":
            return [self._chunk({"content": event["delta"].get("text", "")}, None)]
        if kind == "message_delta":
            self._completion_tokens = int((event.get("usage") or {}).get("output_tokens", 0))
            reason = FINISH_REASONS.get((event.get("delta") or {}).get("stop_reason"), "stop")
            return [self._chunk({}, reason)]
        if kind == "message_stop":
            total = self._prompt_tokens + self._completion_tokens
            usage = {"prompt_tokens": self._prompt_tokens, "completion_tokens": self._completion_tokens, "total_tokens": total}
            return [{**self._base, "choices": [], "usage": usage}]
        if kind == "error":
            error = event.get("error") or {}
            raise UpstreamError(f"anthropic stream error: {error.get('message')}", is_retryable=error.get("type") == "overloaded_error")
        return []

    def _chunk(self, delta: dict, finish_reason: str | None) -> dict:
        return {**self._base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


class AnthropicUpstream:
    """A server speaking the Anthropic Messages API (`url` is its base, e.g. https://api.anthropic.com/v1)."""

    def __init__(self, config: BackendConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self._client = client
        self._url = config.url.rstrip("/") + "/messages"
        self._headers = {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": config.api_key} if config.api_key else {})}

    def serves(self, endpoint: str) -> bool:
        """Only chat completions have a Messages translation (/v1/messages clients arrive as chat)."""
        return endpoint == "/chat/completions"

    async def relay(self, method: str, path: str, params: dict[str, str]) -> tuple[int, dict]:
        """Never asked: no Responses API request is routed here, so no stored response names this backend."""
        raise UpstreamError(f"backend {self.config.name} speaks Anthropic's Messages API and stores no responses",
                            is_retryable=False, status_code=404)  # fmt: skip

    async def complete(self, endpoint: str, body: dict) -> dict:
        self._check_endpoint(endpoint)
        try:
            response = await self._client.post(self._url, json=to_messages_request(body), headers=self._headers, timeout=backend_timeout(self.config))
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        if response.status_code != 200:
            raise self._error(response.status_code, response.text)
        return to_chat_completion(response.json())

    async def stream(self, endpoint: str, body: dict) -> AsyncIterator[dict]:
        self._check_endpoint(endpoint)
        request = self._client.build_request(
            "POST", self._url, json=to_messages_request({**body, "stream": True}), headers=self._headers, timeout=backend_timeout(self.config)
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        translator = StreamTranslator()
        try:
            if response.status_code != 200:
                await response.aread()
                raise self._error(response.status_code, response.text)
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:].strip())
                    for chunk in translator.chunks(event):
                        yield chunk
                    if event.get("type") == "message_stop":
                        return
            raise UpstreamError(f"backend {self.config.name} ended its stream before message_stop", is_retryable=True)
        except httpx.HTTPError as error:
            raise transport_error(self.config.name, error) from error
        finally:
            await response.aclose()

    def _error(self, status_code: int, text: str) -> UpstreamError:
        try:
            inner = json.loads(text).get("error") or {}
        except (ValueError, AttributeError):
            inner = {}
        body = error_body(str(inner.get("message") or text[:200]), str(inner.get("type") or "api_error"))
        return UpstreamError(
            f"backend {self.config.name} answered {status_code}",
            is_retryable=status_code in RETRYABLE_STATUS or status_code == 529,
            status_code=status_code,
            body=body,
        )

    def _check_endpoint(self, endpoint: str) -> None:
        """Routing never sends this backend an endpoint it does not serve; refuse one if it does."""
        if not self.serves(endpoint):
            message = f"backend {self.config.name} speaks Anthropic's Messages API: it serves /v1/chat/completions only, not /v1{endpoint}"
            raise UpstreamError(message, is_retryable=False, status_code=400, body=error_body(message, "invalid_request_error"))
