"""`build_app(engine, config)`: the FastAPI app of one server, with every route it answers."""

from __future__ import annotations

import dataclasses
import time
from http import HTTPStatus
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ember.server.admission import AdmissionGate
from ember.server.body_limit import BodySizeLimit
from ember.server.chat_template import load_chat_template
from ember.server.config import ServerConfig
from ember.server.context import ServingContext
from ember.server.errors import ApiError, install_error_handlers
from ember.server.metrics import CONTENT_TYPE, ServerMetrics
from ember.server.protocol import DetokenizeRequest, ModelCard, ModelList, TokenizeRequest
from ember.server.request_log import RequestLogger
from ember.server.requests import parse_request, resolve_model
from ember.server.serving_chat import create_chat_completion
from ember.server.serving_completions import create_completion

DEBUG_STEP_RECORDS = 1024


def build_app(engine, config: ServerConfig | None = None) -> FastAPI:
    """An OpenAI-compatible app serving `engine`; all of its state hangs off this app alone.

    The app does not own the engine: whoever built the engine shuts it down.
    """
    config = config or ServerConfig()
    model_names = config.served_model_names or [engine.model_name]
    metrics = ServerMetrics(engine, model_names[0])
    context = ServingContext(
        engine=engine,
        config=config,
        model_names=model_names,
        chat_template=load_chat_template(engine.tokenizer, config.chat_template),
        admission=AdmissionGate(config.max_waiting, config.retry_after_s, metrics.observe_rejected),
        metrics=metrics,
        request_logger=RequestLogger(config.log_prompts),
        created_time=int(time.time()),
    )
    app = FastAPI(title="ember", version=_version(), docs_url=None, redoc_url=None, openapi_url=None)
    app.state.context = context
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_body_bytes=config.max_body_bytes)
    _add_openai_routes(app, context)
    _add_service_routes(app, context)
    return app


def _add_openai_routes(app: FastAPI, context: ServingContext) -> None:
    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        cards = [
            ModelCard(id=name, created=context.created_time, max_model_len=context.max_model_len)
            for name in context.model_names
        ]
        return JSONResponse(ModelList(data=cards).model_dump())

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> JSONResponse:
        name = resolve_model(model_id, context.model_names)
        card = ModelCard(id=name, created=context.created_time, max_model_len=context.max_model_len)
        return JSONResponse(card.model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(context, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await create_completion(context, request)


def _add_service_routes(app: FastAPI, context: ServingContext) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        reason = context.engine.dead_reason
        if reason is not None:
            return JSONResponse({"status": "engine_dead", "reason": reason}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": _version()})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(context.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = parse_request(TokenizeRequest, await request.body())
        resolve_model(body.model, context.model_names)
        token_ids = _tokenize(context, body)
        return JSONResponse({"tokens": token_ids, "count": len(token_ids), "max_model_len": context.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = parse_request(DetokenizeRequest, await request.body())
        resolve_model(body.model, context.model_names)
        vocab_size = context.tokenizer.vocab_size
        bad = [token for token in body.tokens if token >= vocab_size]
        if bad:
            raise ApiError(f"Token ids must be below {vocab_size}; got {bad[:5]}.", param="tokens")
        return JSONResponse({"prompt": context.tokenizer.decode(body.tokens)})

    if context.config.enable_debug_endpoints:

        @app.get("/debug/engine")
        async def debug_engine() -> JSONResponse:
            return JSONResponse(_engine_snapshot(context))


def _tokenize(context: ServingContext, body: TokenizeRequest) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise ApiError("Send exactly one of 'prompt' and 'messages'.", param="prompt")
    if body.prompt is not None:
        return context.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    if context.chat_template is None:
        raise ApiError("This model has no chat template to render 'messages' with.", param="messages")
    text = context.chat_template.render(body.messages, add_generation_prompt=body.add_generation_prompt)
    return context.tokenizer.encode(text, add_special_tokens=False)


def _engine_snapshot(context: ServingContext) -> dict:
    """Engine stats and recent step records, for tests and operators (`GET /debug/engine`)."""
    stats = context.engine.stats()
    records = list(context.engine.step_records())[-DEBUG_STEP_RECORDS:]
    return {
        "stats": dataclasses.asdict(stats),
        "server_num_waiting": context.admission.num_waiting,
        "step_records": [dataclasses.asdict(record) for record in records],
    }


def _version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "0+unknown"
