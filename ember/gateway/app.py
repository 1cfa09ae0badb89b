"""`build_app(config)`: the gateway's FastAPI app; all of its state hangs off this one app."""

from __future__ import annotations

import contextlib
import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ember.gateway.anthropic import AnthropicUpstream
from ember.gateway.anthropic_front import handle_messages
from ember.gateway.cache import CacheEntries, LocalEntries, RedisEntries, SemanticCache
from ember.gateway.config import GatewayConfig
from ember.gateway.dispatch import Dispatcher
from ember.gateway.errors import GatewayError, install_error_handlers
from ember.gateway.keys import KeyRing
from ember.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from ember.gateway.redis_store import RedisStore
from ember.gateway.request_body import read_json_body
from ember.gateway.request_log import RequestLogger
from ember.gateway.responses import RESPONSES_ENDPOINT
from ember.gateway.serving import (
    GatewayState,
    handle_generation,
    handle_stored_response,
)
from ember.gateway.sqlite_store import SQLiteStore
from ember.gateway.store import Store
from ember.gateway.tracing import GatewayTracing
from ember.gateway.upstream import OpenAIUpstream, Upstream

MAX_CONNECTIONS_PER_GATEWAY = 512


def build_state(config: GatewayConfig) -> GatewayState:
    """The gateway's state: one HTTP client pool, one store, per-backend live state."""
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=MAX_CONNECTIONS_PER_GATEWAY, max_keepalive_connections=64))
    upstreams: dict[str, Upstream] = {
        backend.name: (AnthropicUpstream if backend.kind == "anthropic" else OpenAIUpstream)(backend, client)
        for backend in config.backends
    }
    store = open_store(config)
    dispatcher = Dispatcher(config, upstreams)
    return GatewayState(
        config=config,
        dispatcher=dispatcher,
        store=store,
        keys=KeyRing(config, store),
        cache=SemanticCache(config.cache, open_cache_entries(config)),
        metrics=GatewayMetrics(dispatcher.states, dispatcher.is_cooling_down),
        tracing=GatewayTracing(config.observability.trace_exporter),
        request_logger=RequestLogger(config.observability.log_prompts),
        client=client,
    )


def open_store(config: GatewayConfig) -> Store:
    """The store the config names (chosen here, above the stores, so store.py imports neither)."""
    if config.store.kind == "redis":
        return RedisStore(config.store.url, config.store.namespace)
    return SQLiteStore(config.store.path)


def open_cache_entries(config: GatewayConfig) -> CacheEntries:
    """Cache entries in Redis (shared by the replicas) with the Redis store, else in this process."""
    if config.store.kind == "redis":
        return RedisEntries(config.cache, config.store.url, config.store.namespace)
    return LocalEntries(config.cache)


def build_app(config: GatewayConfig) -> FastAPI:
    """An OpenAI-compatible gateway app for `config`; `app.state.gateway` is its GatewayState."""
    state = build_state(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        for task in list(state.detached):
            await task
        await state.client.aclose()
        await state.store.close()
        await state.cache.entries.close()
        state.tracing.shutdown()

    app = FastAPI(title="ember gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.gateway = state
    install_error_handlers(app)
    _add_openai_routes(app, state)
    _add_service_routes(app, state)
    return app


def _add_openai_routes(app: FastAPI, state: GatewayState) -> None:
    created = int(time.time())

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        key = await state.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
        names = [name for model in state.config.models if key.allows(model.name) for name in (model.name, *model.aliases)]
        cards = [{"id": name, "object": "model", "created": created, "owned_by": "ember-gateway"} for name in names]
        return JSONResponse({"object": "list", "data": cards})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle_generation(state, request, "/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle_generation(state, request, "/completions")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await handle_generation(state, request, RESPONSES_ENDPOINT)

    @app.get("/v1/responses/{response_id}")
    async def stored_response(request: Request, response_id: str) -> Response:
        return await handle_stored_response(state, request, "GET", response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        return await handle_stored_response(state, request, "DELETE", response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def response_input_items(request: Request, response_id: str) -> Response:
        return await handle_stored_response(state, request, "GET", response_id, "/input_items")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await handle_messages(state, request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await handle_generation(state, request, "/embeddings")


def _add_service_routes(app: FastAPI, state: GatewayState) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/admin/keys/revoke")
    async def revoke_key(request: Request) -> JSONResponse:
        """Body `{"key_sha256": ...}`: every replica sharing the store refuses the key from now on."""
        state.keys.check_admin(request.headers.get("authorization"))
        body = await read_json_body(request, state.config.limits)
        digest = body.get("key_sha256")
        if not isinstance(digest, str) or len(digest) != 64:
            raise GatewayError("`key_sha256` must be the key's SHA-256 hex digest", param="key_sha256")
        await state.store.revoke(digest.lower())
        return JSONResponse({"revoked": digest.lower()})

    @app.get("/admin/keys/{name}/usage")
    async def key_usage(name: str, request: Request) -> JSONResponse:
        state.keys.check_admin(request.headers.get("authorization"))
        key = next((key for key in state.config.keys if key.name == name), None)
        if key is None:
            raise GatewayError(f"no key named {name!r} in the config", status_code=404, param="name")
        totals = await state.store.totals(key.key_sha256)
        return JSONResponse({"name": name, **totals.__dict__, "budget_nano_usd": key.budget_nano_usd})
