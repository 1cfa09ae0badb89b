"""Small real HTTP backends for gateway tests: an OpenAI-compatible server whose behaviour is
chosen per instance (answer, fail, stall, die mid-stream) and an Anthropic Messages server.

They answer deterministically: the reply to a prompt is `"<name> says: " + the last user
message`, one word per token and per stream chunk (per `response.output_text.delta` event on
/v1/responses); prompt tokens are the words of all messages. Each server counts the requests it
received, so tests can tell where requests went. /v1/responses refuses fields ember's server
does not know (`max_tokens`, `stream_options`), as ember's does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.gateway.harness import ThreadedApp


@dataclasses.dataclass
class Behaviour:
    """`mode`: ok, fail (HTTP 500), stall (never answers), die_mid_stream (closes after
    `tokens_before_stall` chunks), stall_mid_stream (waits forever after them)."""

    mode: str = "ok"
    token_delay_s: float = 0.0
    tokens_before_stall: int = 3


@dataclasses.dataclass
class BackendRecord:
    requests: int = 0
    disconnects: int = 0  # stalled requests whose client (the gateway) closed the connection
    bodies: list = dataclasses.field(default_factory=list)


def prompt_words(body: dict) -> list[str]:
    if "messages" in body:
        return " ".join(str(message.get("content", "")) for message in body["messages"]).split()
    prompt = body.get("prompt", "")
    return (prompt if isinstance(prompt, str) else " ".join(map(str, prompt))).split()


def reply_words(name: str, body: dict) -> list[str]:
    if "messages" in body:
        last = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), {"content": ""})
        words = [name, "says:", *str(last.get("content", "")).split()]
    else:
        words = [name, "says:", *prompt_words(body)]
    return words[: int(body.get("max_tokens") or 16)]


RESPONSES_FIELDS = frozenset({"model", "input", "instructions", "max_output_tokens", "stream", "temperature", "top_p", "text", "user"})


def response_turns(body: dict) -> list[tuple[str, str]]:
    """(role, text) of each turn of a Responses request: instructions, then the input items."""
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    turns = [("system", body["instructions"])] if body.get("instructions") else []
    for item in items:
        content = item.get("content", item.get("output", ""))
        turns.append((item.get("role", "tool"), content if isinstance(content, str) else "".join(part["text"] for part in content)))
    return turns


def response_events(name: str, body: dict, behaviour: Behaviour):
    """The Responses API stream, as ember's server sends it: numbered typed events, then [DONE]."""
    turns = response_turns(body)
    last = next((text for role, text in reversed(turns) if role == "user"), "")
    words = [name, "says:", *last.split()][: int(body.get("max_output_tokens") or 16)]
    usage = {"input_tokens": len(" ".join(text for _, text in turns).split()), "input_tokens_details": {"cached_tokens": 1},
             "output_tokens": len(words), "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    is_cut = len(words) == body.get("max_output_tokens")
    text = " ".join(words)
    message = {"type": "message", "id": "msg_1", "status": "incomplete" if is_cut else "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}  # fmt: skip
    shell = {"id": f"resp_{name}", "object": "response", "created_at": 0, "status": "in_progress", "model": body["model"], "output": [],
             "error": None, "incomplete_details": None, "instructions": body.get("instructions"), "tools": [], "tool_choice": "auto",
             "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0, "metadata": {}, "usage": None}  # fmt: skip
    final = {**shell, "status": message["status"], "output": [message], "usage": usage,
             "incomplete_details": {"reason": "max_output_tokens"} if is_cut else None}  # fmt: skip
    yield "response.created", {"response": shell}
    yield "response.in_progress", {"response": shell}
    yield "response.output_item.added", {"output_index": 0, "item": {**message, "status": "in_progress", "content": []}}
    yield "response.content_part.added", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": ""}}
    for index, word in enumerate(words):
        if behaviour.mode in ("die_mid_stream", "stall_mid_stream") and index == behaviour.tokens_before_stall:
            yield behaviour.mode, {}
        yield "response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": word if index == 0 else " " + word}
    yield "response.output_text.done", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "text": text}
    yield "response.output_item.done", {"output_index": 0, "item": message}
    yield "response.incomplete" if is_cut else "response.completed", {"response": final}


def responses_route(app: FastAPI, name: str, behaviour: Behaviour, record: BackendRecord) -> None:
    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await request.json()
        record.requests += 1
        record.bodies.append(body)
        if behaviour.mode == "fail":
            return JSONResponse({"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}, status_code=500)
        unknown = sorted(set(body) - RESPONSES_FIELDS)
        if unknown:
            error = {"message": f"Unknown field {unknown[0]!r}", "type": "invalid_request_error", "param": unknown[0], "code": "unknown_field"}
            return JSONResponse({"error": error}, status_code=400)
        events = list(response_events(name, body, behaviour))
        if not body.get("stream"):
            return JSONResponse(events[-1][1]["response"])
        return StreamingResponse(sse_events(events, behaviour), media_type="text/event-stream")

    async def sse_events(events: list[tuple[str, dict]], behaviour: Behaviour):
        for number, (kind, fields) in enumerate(events):
            if kind == "stall_mid_stream":
                await asyncio.sleep(3600)
            if kind == "die_mid_stream":
                raise ConnectionError("backend dies mid-stream")
            if behaviour.token_delay_s:
                await asyncio.sleep(behaviour.token_delay_s)
            yield f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': number, **fields})}\n\n"
        yield "data: [DONE]\n\n"


def openai_backend(name: str, behaviour: Behaviour, record: BackendRecord) -> FastAPI:
    app = FastAPI()
    responses_route(app, name, behaviour, record)

    async def generate(request: Request, endpoint: str):
        body = await request.json()
        record.requests += 1
        record.bodies.append(body)
        if behaviour.mode == "fail":
            return JSONResponse({"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}, status_code=500)
        if behaviour.mode == "stall":  # never answers; notes when the gateway gives up on it
            while not await request.is_disconnected():
                await asyncio.sleep(0.02)
            record.disconnects += 1
            return JSONResponse({}, status_code=499)
        if body.get("model") == "reject-me":
            return JSONResponse({"error": {"message": "bad model", "type": "invalid_request_error", "param": "model", "code": "x"}}, status_code=400)
        words = reply_words(name, body)
        prompt_tokens = len(prompt_words(body))
        if body.get("stream"):
            return StreamingResponse(stream(body, endpoint, words, prompt_tokens), media_type="text/event-stream")
        text = " ".join(words)
        choice = {"index": 0, "finish_reason": "length" if len(words) == body.get("max_tokens") else "stop"}
        if endpoint == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words), "total_tokens": prompt_tokens + len(words)}
        return JSONResponse({"id": f"{name}-1", "object": "chat.completion", "created": int(time.time()), "model": body["model"], "choices": [choice], "usage": usage})

    async def stream(body: dict, endpoint: str, words: list[str], prompt_tokens: int):
        options = body.get("stream_options") or {}
        continuous = options.get("continuous_usage_stats")

        def usage(completion: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}

        def chunk(content: str | None, finish: str | None, completion: int) -> str:
            choice = {"index": 0, "finish_reason": finish}
            if endpoint == "chat":
                choice["delta"] = {} if content is None else {"content": content}
            else:
                choice["text"] = content or ""
            payload = {"id": f"{name}-s", "object": "chat.completion.chunk", "created": 0, "model": body["model"], "choices": [choice]}
            if continuous:
                payload["usage"] = usage(completion)
            return f"data: {json.dumps(payload)}\n\n"

        if endpoint == "chat":
            yield f"data: {json.dumps({'id': name, 'object': 'chat.completion.chunk', 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"
        for index, word in enumerate(words):
            if behaviour.mode in ("die_mid_stream", "stall_mid_stream") and index == behaviour.tokens_before_stall:
                if behaviour.mode == "stall_mid_stream":
                    await asyncio.sleep(3600)
                raise ConnectionError("backend dies mid-stream")
            if behaviour.token_delay_s:
                await asyncio.sleep(behaviour.token_delay_s)
            is_last = index == len(words) - 1
            yield chunk(word if index == 0 else " " + word, ("length" if len(words) == body.get("max_tokens") else "stop") if is_last else None, index + 1)
        if options.get("include_usage"):
            yield f"data: {json.dumps({'id': name, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage(len(words))})}\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        body = await request.json()
        record.requests += 1
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        tokens = sum(len(text.split()) for text in inputs)
        data = [{"object": "embedding", "index": index, "embedding": [float(len(text)), 1.0]} for index, text in enumerate(inputs)]
        return JSONResponse({"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    return app


def anthropic_backend(record: BackendRecord) -> FastAPI:
    """A server speaking the Anthropic Messages wire format (JSON and event stream)."""
    app = FastAPI()

    @app.post("/v1/messages")
    async def messages(request: Request):
        body = await request.json()
        record.requests += 1
        record.bodies.append({"headers": dict(request.headers), **body})
        if "max_tokens" not in body:
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}, status_code=400)
        last = body["messages"][-1]["content"]
        words = ["claude", "says:", *last.split()][: body["max_tokens"]]
        input_tokens = len((body.get("system", "") + " " + " ".join(m["content"] for m in body["messages"])).split())
        stop_reason = "max_tokens" if len(words) == body["max_tokens"] else "end_turn"
        if not body.get("stream"):
            return JSONResponse({
                "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{"type": "text", "text": " ".join(words)}], "stop_reason": stop_reason,
                "usage": {"input_tokens": input_tokens, "output_tokens": len(words)},
            })  # fmt: skip

        async def events():
            def event(kind: str, data: dict) -> str:
                return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

            yield event("message_start", {"message": {"id": "msg_2", "type": "message", "role": "assistant", "model": body["model"], "content": [], "usage": {"input_tokens": input_tokens, "output_tokens": 1}}})
            yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            yield event("ping", {})
            for index, word in enumerate(words):
                yield event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": word if index == 0 else " " + word}})
            yield event("content_block_stop", {"index": 0})
            yield event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": len(words)}})
            yield event("message_stop", {})

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class FakeBackend:
    """A started test backend: its URL base (…/v1), its behaviour (mutable) and its record."""

    def __init__(self, name: str, behaviour: Behaviour | None = None, kind: str = "openai") -> None:
        self.name = name
        self.behaviour = behaviour or Behaviour()
        self.record = BackendRecord()
        app = anthropic_backend(self.record) if kind == "anthropic" else openai_backend(name, self.behaviour, self.record)
        self._server = ThreadedApp(app)

    @property
    def url(self) -> str:
        return self._server.base_url + "/v1"

    def __enter__(self) -> FakeBackend:
        self._server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._server.__exit__(*exc)
