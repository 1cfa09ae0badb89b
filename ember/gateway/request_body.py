"""The door: every request body is read within limits, parsed and checked against a typed model
before the gateway reads a field of it or reserves anything.

Only the fields the gateway itself reads (to route, bound, cache or translate a request) are
typed here; every other field passes to the backend as the client sent it, for the backend to
judge. What fails here is a 400 (413 for a body over `limits.max_body_bytes`) naming the field,
so no malformed value reaches the accounting: a negative, non-integer, non-finite or absurd
`max_tokens`, `n` or `max_output_tokens` never becomes a reservation.
"""

from __future__ import annotations

import json
import math
from typing import Annotated

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from ember.gateway.config import LimitsConfig
from ember.gateway.errors import GatewayError
from ember.gateway.responses import RESPONSES_ENDPOINT

MAX_TOKENS = 2**31 - 1  # no model has a context past a 32-bit count; larger caps are typos or attacks
MAX_CHOICES = 128  # OpenAI's own limit on n

TokenCap = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
Choices = Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)]
FiniteNumber = Annotated[float, Field(strict=True)]
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]
TextsOrTokens = StrictStr | Annotated[list[StrictStr], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]


class Forwarded(BaseModel):
    """A body whose typed fields the gateway reads; the rest pass to the backend untouched."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(Forwarded):
    """`stream_options`: the gateway reads include_usage (its own streams always ask for usage)."""

    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None


class ContentPart(Forwarded):
    """One part of a message's content; only text parts carry text the gateway counts."""

    type: StrictStr
    text: StrictStr | None = None


Content = StrictStr | list[ContentPart]


class GenerationFields(Forwarded):
    """Fields every generation endpoint shares."""

    model: StrictStr | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    n: Choices | None = None
    temperature: Annotated[FiniteNumber, Field(ge=0)] | None = None
    user: StrictStr | None = None


class ChatMessage(Forwarded):
    """One chat message: its role and text (or parts) are the prompt the gateway bounds and caches."""

    role: StrictStr
    content: Content | None = None


class ChatBody(GenerationFields):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: TokenCap | None = None
    max_completion_tokens: TokenCap | None = None


class CompletionBody(GenerationFields):
    """`POST /v1/completions`: max_tokens may be 0 (with echo: the prompt scored, nothing generated)."""

    prompt: TextsOrTokens
    max_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] | None = None
    best_of: Choices | None = None
    echo: StrictBool | None = None


class ResponseItem(Forwarded):
    """One `input` item of a Responses request: a message, a function call or its output."""

    type: StrictStr | None = None
    role: StrictStr | None = None
    content: Content | None = None
    name: StrictStr | None = None
    arguments: StrictStr | None = None
    output: Content | None = None


class ResponsesBody(GenerationFields):
    """`POST /v1/responses`."""

    input: StrictStr | list[ResponseItem]
    instructions: StrictStr | None = None
    max_output_tokens: TokenCap | None = None
    previous_response_id: StrictStr | None = None


class EmbeddingBody(Forwarded):
    """`POST /v1/embeddings`."""

    model: StrictStr | None = None
    input: TextsOrTokens


class AnthropicBlock(Forwarded):
    """One content block of a Messages request; text blocks become the chat message's text."""

    type: StrictStr
    text: StrictStr | None = None


AnthropicContent = StrictStr | list[AnthropicBlock]


class AnthropicMessage(Forwarded):
    """One message of a Messages request."""

    role: StrictStr
    content: AnthropicContent


class MessagesBody(Forwarded):
    """`POST /v1/messages` (Anthropic's Messages API): max_tokens is required there."""

    model: StrictStr | None = None
    max_tokens: TokenCap
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: AnthropicContent | None = None
    stop_sequences: list[StrictStr] | None = None
    temperature: Annotated[FiniteNumber, Field(ge=0)] | None = None
    top_p: FiniteNumber | None = None
    top_k: StrictInt | None = None
    stream: StrictBool | None = None


BODY_MODELS: dict[str, type[Forwarded]] = {
    "/chat/completions": ChatBody,
    "/completions": CompletionBody,
    RESPONSES_ENDPOINT: ResponsesBody,
    "/embeddings": EmbeddingBody,
    "/messages": MessagesBody,
}


async def read_json_body(request: Request, limits: LimitsConfig) -> dict:
    """The request's JSON object, read no further than `limits` allow."""
    return parse_json(await read_body(request, limits.max_body_bytes), limits.max_json_depth)


async def read_validated_body(request: Request, limits: LimitsConfig, endpoint: str) -> dict:
    """The request's JSON object, checked against the endpoint's model (400 naming the field)."""
    body = await read_json_body(request, limits)
    validate_body(endpoint, body)
    return body


def validate_body(endpoint: str, body: dict) -> None:
    """Raise a 400 GatewayError naming the first malformed field of `body` for `endpoint`."""
    try:
        BODY_MODELS[endpoint].model_validate(body)
    except ValidationError as error:
        raise invalid_field(error) from None


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body; 413 as soon as it is known to exceed `max_bytes` (declared or received)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise body_too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise body_too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, max_depth: int) -> dict:
    """A JSON object of at most `max_depth` nested levels, with finite numbers only."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise too_deep(max_depth) from None
    except ValueError as error:
        raise GatewayError(f"request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise GatewayError("request body must be a JSON object", code="invalid_json")
    check_structure(body, max_depth)
    return body


def check_structure(body: dict, max_depth: int) -> None:
    """Refuse a body nesting arrays and objects deeper than `max_depth` (the top object is level 1)
    or holding NaN / Infinity or a lone surrogate anywhere (Python's parser reads them; no backend
    should, no bound may be computed from one, and neither can be sent on as JSON text). Iterative, so no body can exhaust the stack here."""
    pending: list[tuple[object, tuple]] = [(body, ())]
    while pending:
        item, path = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise invalid_value(path, f"{item} is not a finite number")
        if isinstance(item, str) and not is_utf8(item):
            raise invalid_value(path, "a string with an unpaired UTF-16 surrogate (\\ud800-\\udfff) is no text")
        if isinstance(item, (dict, list)):
            if len(path) >= max_depth:
                raise too_deep(max_depth)
            if isinstance(item, dict) and not all(is_utf8(name) for name in item):
                raise invalid_value(path, "a field name with an unpaired UTF-16 surrogate is no text")
            pending.extend((child, (*path, name)) for name, child in (item.items() if isinstance(item, dict) else enumerate(item)))


def is_utf8(text: str) -> bool:
    """Whether `text` can be sent on as UTF-8 (JSON's \\u escapes can spell lone surrogates, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def invalid_value(path: tuple, reason: str) -> GatewayError:
    """The 400 naming the field at `path` and what is wrong with its value."""
    param = param_name(path)
    return GatewayError(f"invalid value for `{param}`: {reason}", param=param, code="invalid_value")


def param_name(path: tuple) -> str | None:
    """A field's path as a client writes it: `messages[0].content`."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".") or None


def invalid_field(error: ValidationError) -> GatewayError:
    """The 400 for a body that fails its model: the field is the path every failure of the first
    item shares (a union's alternatives each fail below it), written `messages[0].content`."""
    failures = error.errors()
    first = failures[0]
    indices = [(position, part) for position, part in enumerate(first["loc"]) if isinstance(part, int)]
    paths = [
        failure["loc"] for failure in failures if failure["loc"][:1] == first["loc"][:1]
        and all(len(failure["loc"]) <= position or failure["loc"][position] == part for position, part in indices)
    ]  # fmt: skip
    shared = []
    for parts in zip(*paths, strict=False):  # the shortest path bounds the shared prefix
        if any(part != parts[0] for part in parts):
            break
        shared.append(parts[0])
    param = param_name(tuple(shared))
    if first["type"] == "missing" and len(shared) == len(first["loc"]):
        return GatewayError(f"`{param}` is required", param=param, code="missing_required_parameter")
    return GatewayError(f"invalid value for `{param}`: {first['msg']}", param=param, code="invalid_value")


def body_too_large(max_bytes: int) -> GatewayError:
    """The 413 for a body past `limits.max_body_bytes`."""
    return GatewayError(
        f"request body is larger than {max_bytes} bytes (limits.max_body_bytes)", status_code=413, code="request_too_large"
    )


def too_deep(max_depth: int) -> GatewayError:
    """The 400 for a body nesting past `limits.max_json_depth`."""
    return GatewayError(f"request body nests deeper than {max_depth} levels (limits.max_json_depth)", code="too_deeply_nested")
