"""`build_app(engine, config)`: the FastAPI app of one server, with every route it answers."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from http import HTTPStatus
from importlib import metadata
from pathlib import Path

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ember.engine.client import ReplicatedEngineClient
from ember.engine.lora_request import LoRARequest
from ember.models.lora_adapter import LoRAAdapterError, read_adapter_config
from ember.server.common.admission import AdmissionGate
from ember.server.common.api_key import ApiKeyGate
from ember.server.common.body_limit import BodyLimits
from ember.server.common.drain import Drain
from ember.server.common.errors import ApiError, install_error_handlers
from ember.server.common.metrics import CONTENT_TYPE, ServerMetrics
from ember.server.common.request_log import RequestLogger
from ember.server.completions.chat import create_chat_completion
from ember.server.completions.text import create_completion
from ember.server.config import ServerConfig
from ember.server.embeddings.serving import create_embeddings
from ember.server.openai.chat_template import load_chat_template, request_templates
from ember.server.openai.engine_requests import (
    chat_template_for,
    check_rendering,
    parse_request,
    render_request,
    resolve_model,
)
from ember.server.openai.prompt_encoding import PromptEncoder
from ember.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    UnloadLoRAAdapterRequest,
)
from ember.server.openapi import (
    DELETED_RESPONSE_SCHEMA,
    INPUT_ITEMS_SCHEMA,
    METRICS_ANSWERS,
    answers,
    body_of,
    install_openapi,
)
from ember.server.responses.models import ResponseObject, ResponsesRequest
from ember.server.responses.serving import create_response, input_items_page, stored
from ember.server.serving.context import ServingContext
from ember.server.serving.response_store import ResponseStore

DEBUG_STEP_RECORDS = 1024


def build_app(engine, config: ServerConfig | None = None) -> FastAPI:
    """An OpenAI-compatible app serving `engine`; all of its state hangs off this app alone.

    The app does not own the engine: whoever built the engine shuts it down.
    """
    config = config or ServerConfig()
    model_names = config.served_model_names or [engine.model_name]
    metrics = ServerMetrics(engine, model_names[0])
    admission = AdmissionGate(engine, config.max_waiting, config.retry_after_s, metrics.observe_rejected)
    context = ServingContext(
        engine=engine,
        config=config,
        model_names=list(model_names),
        chat_template=load_chat_template(engine.tokenizer, config.chat_template),
        request_templates=request_templates(engine.tokenizer, config.trust_request_chat_template),
        encoder=PromptEncoder(engine.tokenizer, engine.max_model_len),
        admission=admission,
        drain=Drain(admission, config.drain_timeout_s, config.retry_after_s),
        metrics=metrics,
        request_logger=RequestLogger(config.log_prompts, enabled=config.log_requests),
        created_time=int(time.time()),
        response_store=ResponseStore(config.responses_store, config.max_stored_responses),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The first streamed response would otherwise import anyio's asyncio backend (measured 0.28 s
        # of the first client's time to first token); a task group loads it now, before any request.
        async with anyio.create_task_group():
            pass
        yield
        context.encoder.close()
        context.response_store.close()

    for name, path in config.lora_modules.items():
        _add_adapter(context, name, path)
    app = FastAPI(title="ember", version=_version(), lifespan=lifespan)
    app.state.context = context
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(BodyLimits, max_body_bytes=config.max_body_bytes, body_timeout_s=config.body_timeout_s)
    if config.api_keys:
        app.add_middleware(ApiKeyGate, keys=config.api_keys)  # added last: runs first, before any body is read
    _add_openai_routes(app, context)
    _add_service_routes(app, context)
    if config.allow_runtime_lora_updating:
        _add_lora_routes(app, context)
    return app


def _add_adapter(context: ServingContext, name: str, path: str) -> None:
    """Serve the adapter in `path` as model `name` (the engine reads it when a request first asks for it). Its id comes
    from the folder, so every app over one engine gives one folder one id (the engine keys slots and cached blocks by
    it, and refuses one id for two folders)."""
    digest = hashlib.sha256(str(Path(path).resolve()).encode()).digest()
    context.adapters[name] = LoRARequest(name, int.from_bytes(digest[:7], "big") + 1, path)
    context.model_names.append(name)


def _add_lora_routes(app: FastAPI, context: ServingContext) -> None:
    """vLLM's runtime adapter routes. Unloading takes the name away from new requests; a request already running
    with the adapter finishes with it (the engine keeps the adapter until its slot is wanted)."""

    @app.post("/v1/load_lora_adapter", openapi_extra=body_of(LoadLoRAAdapterRequest))
    async def load_lora_adapter(request: Request) -> Response:
        body = parse_request(LoadLoRAAdapterRequest, await request.body())
        if body.lora_name in context.model_names:
            raise ApiError(f"The model name {body.lora_name!r} is already served; unload it first or choose another name.",
                           param="lora_name", code="invalid_value")
        try:
            read_adapter_config(Path(body.lora_path))
        except LoRAAdapterError as error:
            raise ApiError(str(error), param="lora_path", code="invalid_value") from error
        _add_adapter(context, body.lora_name, body.lora_path)
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

    @app.post("/v1/unload_lora_adapter", openapi_extra=body_of(UnloadLoRAAdapterRequest))
    async def unload_lora_adapter(request: Request) -> Response:
        body = parse_request(UnloadLoRAAdapterRequest, await request.body())
        if body.lora_name not in context.adapters:
            raise ApiError(f"No LoRA adapter is served as {body.lora_name!r}; it serves {sorted(context.adapters)}.",
                           status_code=HTTPStatus.NOT_FOUND, error_type="not_found_error", param="lora_name",
                           code="model_not_found")
        del context.adapters[body.lora_name]
        context.model_names.remove(body.lora_name)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type="text/plain")


def _model_card(context: ServingContext, name: str) -> ModelCard:
    """A model id's card; an adapter's names the base model it runs on as its `parent` (and `root`), as vLLM's."""
    parent = context.model_names[0] if name in context.adapters else None
    return ModelCard(id=name, created=context.created_time, max_model_len=context.max_model_len, parent=parent,
                     root=context.adapters[name].lora_path if parent else name)


def _add_openai_routes(app: FastAPI, context: ServingContext) -> None:
    @app.get("/v1/models", responses=answers(ModelList))
    async def list_models() -> JSONResponse:
        cards = [_model_card(context, name) for name in context.model_names]
        return JSONResponse(ModelList(data=cards).model_dump())

    @app.get("/v1/models/{model_id:path}", responses=answers(ModelCard))
    async def get_model(model_id: str) -> JSONResponse:
        return JSONResponse(_model_card(context, resolve_model(model_id, context.model_names)).model_dump())

    @app.post(
        "/v1/chat/completions",
        openapi_extra=body_of(ChatCompletionRequest),
        responses=answers(ChatCompletionResponse, streams=True),
    )
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(context, request)

    @app.post(
        "/v1/completions",
        openapi_extra=body_of(CompletionRequest),
        responses=answers(CompletionResponse, streams=True),
    )
    async def completions(request: Request) -> Response:
        return await create_completion(context, request)

    @app.post("/v1/responses", openapi_extra=body_of(ResponsesRequest), responses=answers(ResponseObject, streams=True))
    async def responses(request: Request) -> Response:
        return await create_response(context, request)

    @app.post("/v1/embeddings", openapi_extra=body_of(EmbeddingRequest), responses=answers(EmbeddingResponse))
    async def embeddings(request: Request) -> Response:
        return await create_embeddings(context, request)

    @app.get("/v1/responses/{response_id}", responses=answers(ResponseObject))
    async def stored_response(response_id: str) -> JSONResponse:
        return JSONResponse(stored(context, response_id).response)

    @app.delete("/v1/responses/{response_id}", responses=answers(DELETED_RESPONSE_SCHEMA))
    async def delete_response(response_id: str) -> JSONResponse:
        stored(context, response_id)
        context.response_store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.get("/v1/responses/{response_id}/input_items", responses=answers(INPUT_ITEMS_SCHEMA))
    async def response_input_items(response_id: str, order: str = "desc", limit: int = 20, after: str | None = None) -> JSONResponse:
        return JSONResponse(input_items_page(stored(context, response_id), order, limit, after))


def _replicas_health(engine: ReplicatedEngineClient) -> dict:
    """/health of a data-parallel server (some replica is up): "ok" when every replica is, else "degraded", and
    each replica's state."""
    replicas = engine.replica_health()
    return {
        "status": "ok" if all(replica.is_up for replica in replicas) else "degraded",
        "replicas": [dataclasses.asdict(replica) for replica in replicas],
    }


def _add_service_routes(app: FastAPI, context: ServingContext) -> None:
    @app.get("/health", responses=answers(None))
    async def health() -> JSONResponse:
        reason = context.engine.dead_reason
        if reason is not None:
            return JSONResponse({"status": "engine_dead", "reason": reason}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
        if context.drain.is_draining:
            raise ApiError(
                "The server is shutting down.",
                status_code=HTTPStatus.SERVICE_UNAVAILABLE,
                error_type="server_error",
                code="server_shutting_down",
                headers={"Retry-After": str(context.config.retry_after_s)},
            )
        if isinstance(context.engine, ReplicatedEngineClient):
            return JSONResponse(_replicas_health(context.engine))
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": _version()})

    @app.get("/metrics", response_class=PlainTextResponse, responses=METRICS_ANSWERS)
    async def metrics() -> Response:
        return Response(context.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/tokenize", openapi_extra=body_of(TokenizeRequest), responses=answers(TokenizeResponse))
    async def tokenize(request: Request) -> JSONResponse:
        body = parse_request(TokenizeRequest, await request.body())
        resolve_model(body.model, context.model_names)
        token_ids = await _tokenize(context, body)
        return JSONResponse({"tokens": token_ids, "count": len(token_ids), "max_model_len": context.max_model_len})

    @app.post("/detokenize", openapi_extra=body_of(DetokenizeRequest), responses=answers(DetokenizeResponse))
    async def detokenize(request: Request) -> JSONResponse:
        body = parse_request(DetokenizeRequest, await request.body())
        resolve_model(body.model, context.model_names)
        vocab_size = context.tokenizer.vocab_size
        bad = [token for token in body.tokens if token >= vocab_size]
        if bad:
            raise ApiError(
                f"Token ids must be below {vocab_size}; got {bad[:5]}.", param="tokens", code="invalid_value"
            )
        return JSONResponse({"prompt": context.tokenizer.decode(body.tokens)})

    if context.config.enable_debug_endpoints:

        @app.get("/debug/engine")
        async def debug_engine() -> JSONResponse:
            return JSONResponse(_engine_snapshot(context))


async def _tokenize(context: ServingContext, body: TokenizeRequest) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise ApiError("Send exactly one of 'prompt' and 'messages'.", param="prompt", code="invalid_value")
    if body.prompt is not None:
        return await context.encoder.encode(body.prompt, add_special_tokens=body.add_special_tokens, param="prompt")
    check_rendering(body, body.messages)
    template = chat_template_for(body, context.chat_template, context.request_templates)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    text = await context.encoder.render(template, body.messages, render_request(body, tools))
    return await context.encoder.encode(text, add_special_tokens=False, param="messages")


def _engine_snapshot(context: ServingContext) -> dict:
    """Engine stats and recent step records, for tests and operators (`GET /debug/engine`)."""
    stats = context.engine.stats()
    records = list(context.engine.step_records())[-DEBUG_STEP_RECORDS:]
    return {
        "stats": dataclasses.asdict(stats),
        "server_num_waiting": context.admission.num_waiting,
        "server_num_held": context.admission.num_held,
        "server_num_in_flight": context.admission.num_in_flight,
        "step_records": [dataclasses.asdict(record) for record in records],
    }


def _version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "0+unknown"
