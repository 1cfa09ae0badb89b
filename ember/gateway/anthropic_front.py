"""`POST /v1/messages`: clients speaking the Anthropic Messages API, served by any backend.

The request is translated to an OpenAI chat completion, goes through the same path as every
other request (keys, cache, budgets, routing, retries), and the answer is translated back:
a Messages JSON body, or the `message_start` ... `message_stop` event stream. Errors come back
in the Anthropic shape `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ember.gateway.errors import GatewayError
from ember.gateway.serving import Front, GatewayState, handle_generation

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def to_chat_request(body: dict) -> dict:
    """The OpenAI chat request for an Anthropic Messages request (one `validate_body` accepted)."""
    messages = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system if isinstance(system, str) else _text(system)})
    for message in body.get("messages") or ():
        content = message.get("content")
        messages.append({"role": message.get("role"), "content": content if isinstance(content, str) else _text(content)})
    request = {"model": body.get("model"), "messages": messages, "max_tokens": body["max_tokens"]}
    if body.get("stop_sequences"):
        request["stop"] = list(body["stop_sequences"])
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            request[name] = body[name]
    if body.get("stream"):
        request["stream_options"] = {"include_usage": True}
    return request


def to_message(response: dict) -> dict:
    """The Messages response for an OpenAI chat completion."""
    choice = (response.get("choices") or [{}])[0]
    usage = response.get("usage") or {}
    return {
        "id": response.get("id"), "type": "message", "role": "assistant", "model": response.get("model"),
        "content": [{"type": "text", "text": (choice.get("message") or {}).get("content") or ""}],
        "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"), "stop_sequence": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }  # fmt: skip


async def handle_messages(state: GatewayState, request: Request) -> Response:
    """`POST /v1/messages`: validated as a Messages request, served as a chat completion."""
    try:
        response = await handle_generation(state, request, "/chat/completions", Front("/messages", to_chat_request))
    except GatewayError as error:
        return anthropic_error(error)
    if isinstance(response, StreamingResponse):
        return StreamingResponse(as_message_events(response.body_iterator), media_type="text/event-stream")
    if response.status_code != 200:
        return response
    return JSONResponse(to_message(json.loads(response.body)), headers={k: v for k, v in response.headers.items() if k.startswith("x-ember")})


async def as_message_events(chunks):
    """OpenAI stream chunks (SSE text) -> Anthropic stream events (the model named as the backend names it, as in
    `to_message`)."""
    started = False
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    stop_reason = "end_turn"
    async for text in chunks:
        for line in (text if isinstance(text, str) else text.decode()).splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                yield event("error", {"error": {"type": "api_error", "message": chunk["error"].get("message", "")}})
                return
            if not started:
                started = True
                yield event("message_start", {"message": {"id": chunk.get("id"), "type": "message", "role": "assistant", "model": chunk.get("model"), "content": [], "usage": {"input_tokens": 0, "output_tokens": 0}}})
                yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    yield event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": content}})
                if choice.get("finish_reason"):
                    stop_reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
    yield event("content_block_stop", {"index": 0})
    yield event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}})
    yield event("message_stop", {})


def event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def anthropic_error(error: GatewayError) -> JSONResponse:
    kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
    kind = kinds.get(error.status_code, "invalid_request_error" if error.status_code < 500 else "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": error.message}}, status_code=error.status_code, headers=error.headers)


def _text(blocks) -> str:
    return "".join(block["text"] for block in blocks if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str))
