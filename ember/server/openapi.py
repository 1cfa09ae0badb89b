"""`/openapi.json` with the real request and response schemas of the routes.

The OpenAI routes read their bodies themselves (strict pydantic parsing with OpenAI-style
errors, off FastAPI's own validation), so FastAPI cannot see their models: each route declares
its body and answers here, and the schemas of those pydantic models are merged into
`components.schemas` of the document FastAPI builds.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ember.server.protocol import (
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
from ember.server.responses_api import ResponseObject, ResponsesRequest

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


def answers(model: type[BaseModel] | None, *, streams: bool = False) -> dict:
    """`responses` of a route: `model` on 200 (plus SSE when it may stream), the error body on 4xx/5xx."""
    success: dict = {"description": "Success"}
    if model is not None:
        success["content"] = {"application/json": {"schema": ref(model)}}
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
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi
