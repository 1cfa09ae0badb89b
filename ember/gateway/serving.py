"""The path of one generation request through the gateway.

authenticate -> read and check the body (`request_body.py`) -> resolve the model (aliases, allow
list, a backend that has the endpoint) -> semantic cache -> reserve the request's upper-bound
tokens and cost in the store -> dispatch (routing, retries, fallbacks) -> settle the reservation
to the usage received -> metrics, trace, JSON log line (a refused request gets its metric and log
line too).

Every reservation is settled exactly once, whatever happens: success, backend failure, or a
client that goes away (mid-stream, or before a non-streamed answer, which is then cancelled
upstream; settlement runs as a detached task, so cancellation of the request cannot skip it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Callable

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from ember.gateway.accounting import (
    StreamMeter,
    TokenUsage,
    completion_token_bound,
    prompt_text,
    prompt_token_bound,
    stream_meter,
    with_completion_limit,
)
from ember.gateway.cache import SemanticCache
from ember.gateway.config import GatewayConfig, KeyConfig, ModelConfig
from ember.gateway.dispatch import Attempt, AttemptObserver, Dispatcher, OpenedStream
from ember.gateway.errors import GatewayError, error_body
from ember.gateway.keys import KeyRing
from ember.gateway.metrics import GatewayMetrics
from ember.gateway.request_body import read_validated_body
from ember.gateway.request_log import RequestLogger
from ember.gateway.response_owners import ResponseOwners
from ember.gateway.responses import RESPONSES_ENDPOINT, event_type, is_final_event
from ember.gateway.store import MAX_RESERVATION, Denial, LedgerRow, Reservation, Store, window_of
from ember.gateway.tracing import GatewayTracing
from ember.gateway.upstream import UpstreamError

CACHE_OPT_IN_HEADER = "x-ember-cache"


@dataclasses.dataclass
class GatewayState:
    """Everything one gateway app owns; built by `build_app`, closed on shutdown."""

    config: GatewayConfig
    dispatcher: Dispatcher
    store: Store
    keys: KeyRing
    cache: SemanticCache
    metrics: GatewayMetrics
    tracing: GatewayTracing
    request_logger: RequestLogger
    client: httpx.AsyncClient
    detached: set[asyncio.Task] = dataclasses.field(default_factory=set)
    response_owners: ResponseOwners = dataclasses.field(default_factory=ResponseOwners)  # stored responses' servers

    def detach(self, coroutine) -> asyncio.Task:
        """Run `coroutine` to completion even if the request that started it is cancelled."""
        task = asyncio.ensure_future(coroutine)
        self.detached.add(task)
        task.add_done_callback(self.detached.discard)
        return task


@dataclasses.dataclass(frozen=True)
class Front:
    """Another API's route served as one of ours: its body is checked against `endpoint`'s model, then translated."""

    endpoint: str
    translate: Callable[[dict], dict]


@dataclasses.dataclass
class Call:
    """One client request as the gateway sees it."""

    request_id: str
    endpoint: str
    key: KeyConfig
    model: ModelConfig
    body: dict
    prompt_text: str
    prompt_bound: int
    completion_bound: int
    started_s: float
    span: Span
    is_cacheable: bool
    cache_scope: str
    is_settled: bool = False
    pinned_backend: str | None = None  # the server holding the response this one continues (previous_response_id)

    @property
    def is_stream(self) -> bool:
        """Embeddings are never streamed: their `stream` field, if any, is the backend's to refuse."""
        return self.body.get("stream") is True and self.endpoint != "/embeddings"

    @property
    def client_stream_options(self) -> dict:
        options = self.body.get("stream_options")
        return options if isinstance(options, dict) else {}


class RequestObserver(AttemptObserver):
    """One child span and one metric per backend attempt."""

    def __init__(self, state: GatewayState, parent: Span) -> None:
        self._state = state
        self._parent = parent

    def attempt_started(self, attempt: Attempt) -> Span:
        return self._state.tracing.tracer.start_span(
            "gateway.attempt",
            context=trace.set_span_in_context(self._parent),
            attributes={"backend": attempt.backend.name, "model": attempt.model.name, "upstream_model": attempt.upstream_model},
        )

    def attempt_ended(self, handle: Span, attempt: Attempt, error: UpstreamError | None) -> None:
        outcome = "ok" if error is None else ("retryable_error" if error.is_retryable else "client_error")
        self._state.metrics.attempts.labels(attempt.backend.name, outcome).inc()
        if error is not None:
            handle.set_status(Status(StatusCode.ERROR, str(error)))
        handle.set_attribute("outcome", outcome)
        handle.end()


async def handle_generation(state: GatewayState, request: Request, endpoint: str, front: Front | None = None) -> Response:
    """Serve /v1/chat/completions, /v1/completions, /v1/responses or /v1/embeddings (or, through `front`, another API's
    route as one of them). The key is checked before the body is read. Every request writes one log line: `settle`
    writes it for the requests that reach the store, `record_refusal` for the others."""
    started_s = time.monotonic()
    key: KeyConfig | None = None
    model: ModelConfig | None = None
    try:
        key = await state.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
        if front is None:
            body = await read_validated_body(request, state.config.limits, endpoint)
        else:
            body = front.translate(await read_validated_body(request, state.config.limits, front.endpoint))
        model = resolve_model(state.config, body, key)
        check_endpoint(state.dispatcher, model, endpoint)
        call = new_call(state, request, endpoint, key, model, body)
    except GatewayError as error:
        record_refusal(state, endpoint, error, started_s, key, model)
        raise
    try:
        cached = await cached_response(state, call)
        if cached is not None:
            await settle(state, call, None, TokenUsage(), "cached", backend=None)
            finish_span(call.span)
            return cached
        reservation = await reserve(state, call)
        if call.is_stream:
            return await start_stream(state, call, reservation, request)
        return await complete(state, call, reservation, request)
    except GatewayError as error:
        finish_span(call.span, error.message)
        if not call.is_settled:
            record_refusal(state, endpoint, error, call.started_s, key, model, call.request_id)
        raise


def record_refusal(
    state: GatewayState, endpoint: str, error: GatewayError, started_s: float,
    key: KeyConfig | None = None, model: ModelConfig | None = None, request_id: str | None = None,
) -> None:  # fmt: skip
    """The metric and the log line of a request refused before the store saw it: a bad body, key or model, a limit
    (429), an impossible bound. `key` and `model` are None when the refusal came before they were known."""
    state.metrics.requests.labels(model.name if model else "", key.name if key else "", str(error.status_code)).inc()
    state.request_logger.log(
        {
            "request_id": request_id or f"gw-{uuid.uuid4().hex}", "key": key and key.name, "tenant": key and key.tenant,
            "endpoint": endpoint, "model": model and model.name, "backend": None, "status": "refused",
            "http_status": error.status_code, "code": error.code, "latency_ms": round((time.monotonic() - started_s) * 1000, 2),
        }
    )  # fmt: skip


async def handle_stored_response(state: GatewayState, request: Request, method: str, response_id: str, suffix: str = "") -> Response:
    """`GET` / `DELETE /v1/responses/{id}` (and its `/input_items`): passed to the backend that stored the response, for
    the tenant whose key made it; a 404 for a response this gateway did not route (or another tenant's)."""
    key = await state.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    owner = state.response_owners.owner(response_id)
    if owner is None or owner.tenant != key.tenant:
        raise GatewayError(f"no stored response {response_id!r} was made through this gateway with this key's tenant",
                           status_code=404, error_type="not_found_error", param="response_id", code="response_not_found")  # fmt: skip
    upstream = state.dispatcher.upstream(owner.backend)
    try:
        status, body = await upstream.relay(method, f"{RESPONSES_ENDPOINT}/{response_id}{suffix}", dict(request.query_params))
    except UpstreamError as error:
        raise gateway_error_of(error) from None
    if method == "DELETE" and status == 200:
        state.response_owners.forget(response_id)
    return JSONResponse(body, status_code=status)


def resolve_model(config: GatewayConfig, body: dict, key: KeyConfig) -> ModelConfig:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise GatewayError("`model` is required: one of " + ", ".join(config.model_names()), param="model")
    model = config.resolve_model(name)
    if model is None:
        raise GatewayError(
            f"model {name!r} is not served by this gateway; choose one of {config.model_names()}",
            status_code=404, param="model", code="model_not_found",
        )  # fmt: skip
    if not key.allows(model.name):
        raise GatewayError(
            f"key {key.name!r} may not use model {model.name!r}", status_code=403, error_type="permission_error",
            param="model", code="model_not_allowed",
        )  # fmt: skip
    return model


def check_endpoint(dispatcher: Dispatcher, model: ModelConfig, endpoint: str) -> None:
    """Refuse, before anything is reserved, a request that no backend of the model's chain can
    take at all, rather than send a backend a request it cannot read."""
    if not dispatcher.serves(model, endpoint):
        raise GatewayError(
            f"model {model.name!r} cannot serve /v1{endpoint}: its backends (and its fallbacks') speak only Anthropic's "
            "Messages API, which has no such endpoint; use /v1/chat/completions or /v1/messages with this model",
            param="model", code="unsupported_endpoint",
        )  # fmt: skip


def new_call(state: GatewayState, request: Request, endpoint: str, key: KeyConfig, model: ModelConfig, body: dict) -> Call:
    accounting = state.config.accounting
    if endpoint != "/embeddings":
        body = with_completion_limit(endpoint, body, accounting)
    text = prompt_text(endpoint, body)
    opted_in = request.headers.get(CACHE_OPT_IN_HEADER, "").lower() == "on"
    span = state.tracing.tracer.start_span(
        "gateway.request", attributes={"endpoint": endpoint, "model": model.name, "key": key.name, "tenant": key.tenant}
    )
    return Call(
        request_id=f"gw-{uuid.uuid4().hex}",
        endpoint=endpoint,
        key=key,
        model=model,
        body=body,
        prompt_text=text,
        prompt_bound=prompt_token_bound(endpoint, body, accounting),
        completion_bound=0 if endpoint == "/embeddings" else completion_token_bound(endpoint, body, accounting),
        started_s=time.monotonic(),
        span=span,
        is_cacheable=is_cacheable(endpoint, body) and state.cache.is_eligible(body, opted_in),
        cache_scope=SemanticCache.scope(key.tenant, model.name, endpoint, body),
        pinned_backend=_continued_backend(state, endpoint, body, key),
    )


def _continued_backend(state: GatewayState, endpoint: str, body: dict, key: KeyConfig) -> str | None:
    """The backend that stored the response a Responses request continues, where this gateway routed it (and the same
    tenant made it); None to route as usual (a response this gateway never saw: its server decides)."""
    owner = state.response_owners.owner(body.get("previous_response_id")) if endpoint == RESPONSES_ENDPOINT else None
    return owner.backend if owner is not None and owner.tenant == key.tenant else None


def is_cacheable(endpoint: str, body: dict) -> bool:
    """Embeddings are never cached. Responses API answers are cached and replayed only whole: a
    streamed response neither reads nor fills the cache (its events are not rebuilt from a body)."""
    if endpoint == RESPONSES_ENDPOINT:
        return body.get("stream") is not True
    return endpoint != "/embeddings"


async def cached_response(state: GatewayState, call: Call) -> Response | None:
    if not call.is_cacheable:
        return None
    answer = await state.cache.lookup(call.cache_scope, call.prompt_text)
    state.metrics.cache_lookups.labels(call.model.name, "miss" if answer is None else "hit").inc()
    if answer is None:
        return None
    usage = TokenUsage.from_openai(answer.response.get("usage")) or TokenUsage()
    state.metrics.cache_saved_tokens.labels(call.model.name).inc(usage.total_tokens)
    call.span.set_attribute("cache_match", answer.match)
    headers = {"x-ember-cache": "hit", "x-ember-cache-match": answer.match}
    if call.is_stream:
        return StreamingResponse(replay_as_stream(answer.response, call), media_type="text/event-stream", headers=headers)
    return JSONResponse(answer.response, headers=headers)


async def replay_as_stream(response: dict, call: Call):
    """A cached (non-streamed) answer sent as a stream: role, content, finish, usage if asked."""
    choice = (response.get("choices") or [{}])[0]
    base = {"id": response.get("id"), "created": response.get("created"), "model": response.get("model")}
    if call.endpoint == "/chat/completions":
        base["object"] = "chat.completion.chunk"
        text = (choice.get("message") or {}).get("content") or ""
        chunks = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                  {"index": 0, "delta": {"content": text}, "finish_reason": None},
                  {"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]  # fmt: skip
    else:
        base["object"] = "text_completion"
        chunks = [{"index": 0, "text": choice.get("text", ""), "finish_reason": choice.get("finish_reason")}]
    for chunk_choice in chunks:
        yield sse({**base, "choices": [chunk_choice]})
    if call.client_stream_options.get("include_usage"):
        yield sse({**base, "choices": [], "usage": response.get("usage")})
    yield "data: [DONE]\n\n"


async def reserve(state: GatewayState, call: Call) -> Reservation:
    chain_prices = [call.model.price] + [state.config.resolve_model(name).price for name in call.model.fallbacks]
    cost_bound = max(price.cost_nano_usd(call.prompt_bound, call.completion_bound) for price in chain_prices)
    tokens = max(1, call.prompt_bound + call.completion_bound)  # an empty prompt with max_tokens 0 still holds a token
    if max(tokens, cost_bound) > MAX_RESERVATION:
        raise GatewayError(
            f"the request's upper bound ({tokens} tokens: prompt + max_tokens x n per prompt) is too large to reserve; "
            "lower max_tokens, n or the number of prompts", param="max_tokens", code="invalid_value",
        )  # fmt: skip
    outcome = await state.store.reserve(call.key, call.request_id, tokens, cost_bound, time.time())
    if isinstance(outcome, Denial):
        state.metrics.rejections.labels(call.key.name, outcome.code).inc()
        headers = {"retry-after": str(outcome.retry_after_s)} if outcome.retry_after_s else None
        raise GatewayError(outcome.message, status_code=429, error_type="rate_limit_error", code=outcome.code, headers=headers)
    return outcome


async def complete(state: GatewayState, call: Call, reservation: Reservation, request: Request) -> Response:
    """A non-streamed request. A client that leaves before the answer cancels it upstream (closing the backend
    connection, which aborts the generation there) and is billed for what the backend reported: nothing."""
    observer = RequestObserver(state, call.span)
    work = state.dispatcher.complete(call.endpoint, call.body, call.model, call.prompt_text, observer, call.pinned_backend)
    response, attempt = await dispatched(state, call, reservation, request, work)
    usage = TokenUsage.from_openai(response.get("usage")) or TokenUsage(call.prompt_bound, 0)
    if call.endpoint == RESPONSES_ENDPOINT:
        state.response_owners.remember(response.get("id"), attempt.backend.name, call.key.tenant)
    await settle(state, call, reservation, usage, "ok", backend=attempt.backend.name, served_by=attempt.model)
    if call.is_cacheable:
        await state.cache.store(call.cache_scope, call.prompt_text, response)
    finish_span(call.span)
    return JSONResponse(response)


async def dispatched(state: GatewayState, call: Call, reservation: Reservation, request: Request, work):
    """The result of `work` (a dispatcher call), settling the reservation when nothing came of it: no backend served
    the request (`failed`, and the client gets the error), or the client left first (`cancelled`)."""
    try:
        return await until_client_leaves(request, work)
    except UpstreamError as error:
        await settle(state, call, reservation, TokenUsage(), "failed", backend=None)
        raise gateway_error_of(error) from None
    except BaseException:
        await asyncio.shield(state.detach(settle(state, call, reservation, TokenUsage(), "cancelled", backend=None)))
        raise


async def until_client_leaves(request: Request, work):
    """The result of coroutine `work`, unless the client disconnects first: then `work` is cancelled (and awaited, so
    its upstream connection is closed) and a 499 GatewayError raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(client_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself was cancelled
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise GatewayError("the client disconnected before the answer", status_code=499, code="client_disconnected")


async def client_disconnect(request: Request) -> None:
    """Returns when the client has closed its connection (the body is read: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def start_stream(state: GatewayState, call: Call, reservation: Reservation, request: Request) -> Response:
    """Opens the upstream stream before answering, so failures before the first token are
    retried and, if every attempt fails, reported as a plain HTTP error (a client that leaves
    before the first token cancels it, as a non-streamed request)."""
    observer = RequestObserver(state, call.span)
    work = state.dispatcher.open_stream(call.endpoint, call.body, call.model, call.prompt_text, observer, call.pinned_backend)
    opened = await dispatched(state, call, reservation, request, work)
    state.metrics.ttft.labels(call.model.name).observe(time.monotonic() - call.started_s)
    return RelayResponse(StreamRelay(state, call, reservation, opened))


class StreamRelay:
    """Forwards one opened stream to its client and settles it exactly once: when the stream
    ends, fails, is cut by the client, or is never started because the client left first."""

    def __init__(self, state: GatewayState, call: Call, reservation: Reservation, opened: OpenedStream) -> None:
        self._state, self._call, self._reservation, self._opened = state, call, reservation, opened
        self._meter = stream_meter(call.endpoint, call.prompt_bound)
        self._status = "cancelled"
        self._is_finished = False

    async def events(self):
        """The SSE events the client receives."""
        try:
            async for chunk in self._opened.chunks():
                self._meter.note_upstream(chunk)
                self._remember_owner(chunk)
                visible = client_view(self._call.endpoint, chunk, self._call.client_stream_options)
                if visible is not None:
                    yield sse(visible, event_type(visible) if self._call.endpoint == RESPONSES_ENDPOINT else "")
                self._meter.observe(chunk)  # after the yield: only what was handed to the client
            self._status = "ok"
            yield "data: [DONE]\n\n"
        except UpstreamError as error:
            self._status = "failed"  # after the first token: never retried, the client gets an error event
            yield sse(error_body(f"the backend failed mid-stream: {error}", "server_error", code="backend_failed"))
            yield "data: [DONE]\n\n"
        finally:
            await self.finish()

    def _remember_owner(self, chunk: dict) -> None:
        """A Responses stream's final event names the response its backend stored."""
        if self._call.endpoint == RESPONSES_ENDPOINT and is_final_event(chunk) and isinstance(chunk.get("response"), dict):
            self._state.response_owners.remember(chunk["response"].get("id"), self._opened.attempt.backend.name, self._call.key.tenant)

    async def finish(self) -> None:
        """Settle (once) in a detached task, so the request's cancellation cannot skip it."""
        if self._is_finished:
            return
        self._is_finished = True
        await asyncio.shield(self._state.detach(self._settle()))

    async def _settle(self) -> None:
        call, attempt = self._call, self._opened.attempt
        for chunk in self._opened.first_chunks:  # a stream never started still says its prompt size
            self._meter.note_upstream(chunk)
        await self._opened.close()
        usage = self._meter.usage()
        if self._status == "ok" and call.is_cacheable and self._meter.finished:
            await self._state.cache.store(call.cache_scope, call.prompt_text, assembled_response(call, self._meter, usage))
        await settle(self._state, call, self._reservation, usage, self._status, backend=attempt.backend.name, served_by=attempt.model)
        finish_span(call.span, None if self._status == "ok" else self._status)


class RelayResponse(StreamingResponse):
    """An SSE response that settles its relay even if the ASGI server never iterates it."""

    def __init__(self, relay: StreamRelay) -> None:
        super().__init__(relay.events(), media_type="text/event-stream")
        self._relay = relay

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._relay.finish()


def client_view(endpoint: str, chunk: dict, options: dict) -> dict | None:
    """The chunk as this client asked for it: the usage-only chunk only with include_usage,
    usage on content chunks only with continuous_usage_stats. Responses API events pass as they are."""
    if endpoint == RESPONSES_ENDPOINT:
        return chunk
    if not chunk.get("choices") and "usage" in chunk and not chunk.get("error"):
        return chunk if options.get("include_usage") else None
    if "usage" in chunk and not options.get("continuous_usage_stats"):
        chunk = {name: value for name, value in chunk.items() if name != "usage"}
    return chunk


def assembled_response(call: Call, meter: StreamMeter, usage: TokenUsage) -> dict:
    """A non-streamed response body built from a finished stream, for the cache."""
    usage_body = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens, "total_tokens": usage.total_tokens}
    if call.endpoint == "/chat/completions":
        choice = {"index": 0, "message": {"role": "assistant", "content": meter.text()}, "finish_reason": meter.finish_reason}
        return {"id": call.request_id, "object": "chat.completion", "created": int(time.time()), "model": call.model.name, "choices": [choice], "usage": usage_body}
    choice = {"index": 0, "text": meter.text(), "finish_reason": meter.finish_reason}
    return {"id": call.request_id, "object": "text_completion", "created": int(time.time()), "model": call.model.name, "choices": [choice], "usage": usage_body}


async def settle(
    state: GatewayState,
    call: Call,
    reservation: Reservation | None,
    usage: TokenUsage,
    status: str,
    backend: str | None,
    served_by: ModelConfig | None = None,
) -> None:
    """Write the request's ledger row (settling its reservation), metrics and log line."""
    call.is_settled = True
    price_model = served_by or call.model
    cost = price_model.price.cost_nano_usd(usage.prompt_tokens, usage.completion_tokens)
    row = LedgerRow(
        request_id=call.request_id,
        key_sha256=call.key.key_sha256,
        model=price_model.name,
        window=reservation.window if reservation else window_of(time.time()),
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost_nano_usd=cost,
        status=status,
    )
    if reservation is not None:
        await state.store.settle(reservation, row)
    labels = (price_model.name, call.key.name)
    state.metrics.requests.labels(*labels, status).inc()
    state.metrics.tokens.labels(*labels, "prompt").inc(usage.prompt_tokens)
    state.metrics.tokens.labels(*labels, "completion").inc(usage.completion_tokens)
    state.metrics.spend.labels(*labels).inc(cost)
    elapsed_s = time.monotonic() - call.started_s
    state.metrics.latency.labels(price_model.name).observe(elapsed_s)
    call.span.set_attributes({"status": status, "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens})
    if backend:
        call.span.set_attribute("backend", backend)
    state.request_logger.log(
        {
            "request_id": call.request_id, "key": call.key.name, "tenant": call.key.tenant, "endpoint": call.endpoint,
            "model": price_model.name, "backend": backend, "status": status, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "cost_nano_usd": cost, "latency_ms": round(elapsed_s * 1000, 2),
        },
        prompt=call.prompt_text,
    )  # fmt: skip


def gateway_error_of(error: UpstreamError) -> GatewayError:
    """What the client sees when no backend served it: the backend's own 4xx body, or 502/503/504."""
    if error.body is not None and not error.is_retryable:
        inner = error.body["error"]
        return GatewayError(
            str(inner.get("message") or error), status_code=error.status_code, error_type=str(inner.get("type") or "invalid_request_error"),
            param=inner.get("param"), code=inner.get("code"),
        )  # fmt: skip
    status = error.status_code if error.status_code in (503, 504) else 502
    return GatewayError(f"no backend could serve the request: {error}", status_code=status, error_type="server_error", code="backend_unavailable")


def finish_span(span: Span, error: str | None = None) -> None:
    if not span.is_recording():
        return
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def sse(payload: dict, event: str = "") -> str:
    """One SSE event; `event` names its type on an `event:` line (as the Responses API does)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload, separators=(',', ':'))}\n\n"
