"""`/openapi.json` with the real request and response schemas of the routes.

The OpenAI routes read their bodies themselves (strict pydantic parsing with OpenAI-style
errors, off FastAPI's own validation), so FastAPI cannot see their models: each route declares
its body and answers here, and the schemas of those pydantic models are merged into
`components.schemas` of the document FastAPI builds. FastAPI's own 422 answers are dropped from
the document: the app answers a failed validation with a 400 (`ember.server.common.errors`), never 422.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ember.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from ember.server.responses.models import ResponseObject, ResponsesRequest

REF_TEMPLATE = "#/components/schemas/{model}"
REQUEST_MODELS = (ChatCompletionRequest, CompletionRequest, ResponsesRequest, EmbeddingRequest, TokenizeRequest, DetokenizeRequest)
RESPONSE_MODELS = (
    ChatCompletionResponse,
    CompletionResponse,
    ResponseObject,
    EmbeddingResponse,
    TokenizeResponse,
    DetokenizeResponse,
    ModelList,
    ModelCard,
    ErrorResponse,
)


def ref(model: type[BaseModel]) -> dict:
    """A JSON reference to `model`'s schema in the document's components."""
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def body_of(model: type[BaseModel]) -> dict:
    """`openapi_extra` of a route whose JSON body is `model`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref(model)}}}}


# The JSON answers of the stored-response routes that have no pydantic model of their own.
DELETED_RESPONSE_SCHEMA = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}},
}
INPUT_ITEMS_SCHEMA = {
    "type": "object",
    "required": ["object", "data", "has_more"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}},
                   "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                   "has_more": {"type": "boolean"}},
}
METRICS_ANSWERS = {200: {"description": "Prometheus text exposition format",
                         "content": {"text/plain": {"schema": {"type": "string"}}}}}


def answers(model: type[BaseModel] | dict | None, *, streams: bool = False) -> dict:
    """`responses` of a route: `model` (a pydantic model or a JSON schema) on 200 (plus SSE when it may stream),
    the error body on 4xx/5xx."""
    success: dict = {"description": "Success"}
    if model is not None:
        schema = model if isinstance(model, dict) else ref(model)
        success["content"] = {"application/json": {"schema": schema}}
        if streams:
            success["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    error = {"content": {"application/json": {"schema": ref(ErrorResponse)}}}
    return {
        200: success,
        400: {"description": "Invalid request", **error},
        404: {"description": "Unknown model or route", **error},
        503: {"description": "Overloaded or shutting down (see Retry-After)", **error},
    }


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` include the schemas of every request and response model."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, top = models_json_schema(
                [(model, "validation") for model in REQUEST_MODELS]
                + [(model, "serialization") for model in RESPONSE_MODELS],
                ref_template=REF_TEMPLATE,
            )
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(top.get("$defs", {}))
            _drop_unanswered_422(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi


def _drop_unanswered_422(document: dict) -> None:
    """Remove FastAPI's 422 answers (and their schemas once unused): validation failures are answered 400."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
