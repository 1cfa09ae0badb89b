"""OpenAI-style errors: one exception type, one JSON body, handlers so nothing leaks a traceback."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ember.engine.rejection import RequestRejected

logger = logging.getLogger("ember.server")


class ApiError(Exception):
    """A request the server will not serve, with the OpenAI error fields to tell the client why.

    `param` names the offending request field (dotted path) when there is one; `code` is a
    machine-readable reason, never null, so clients can branch on it.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int = HTTPStatus.BAD_REQUEST,
        error_type: str = "invalid_request_error",
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = int(status_code)
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        """The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""
        return error_body(self.message, self.error_type, self.param, self.code)

    def response(self) -> JSONResponse:
        """This error as an HTTP response."""
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


ENGINE_RETRY_AFTER_S = 10


def engine_unavailable(reason: str) -> ApiError:
    """The 503 every request gets once the engine has stopped (it died or is shutting down)."""
    return ApiError(
        f"The engine is not running ({reason}); retry later.",
        status_code=HTTPStatus.SERVICE_UNAVAILABLE,
        error_type="server_error",
        code="engine_unavailable",
        headers={"Retry-After": str(ENGINE_RETRY_AFTER_S)},
    )


@contextlib.contextmanager
def engine_rejections(names: Mapping[str, str] | None = None) -> Iterator[None]:
    """The one place an engine's rejection (from SamplingParams, EngineRequest or the engine's limits) becomes the
    OpenAI 400: `param` is the field as the API names it (`names` maps the engine's name to the API's where they
    differ: "prompt" is a chat's "messages"), `code` the rejection's own ("invalid_value", "context_length_exceeded")."""
    try:
        yield
    except RequestRejected as error:
        param = (names or {}).get(error.param, error.param)
        raise ApiError(f"Invalid value for {param!r}: {error}.", param=param, code=error.code) from error


def error_body(message: str, error_type: str, param: str | None, code: str) -> dict:
    """The OpenAI error JSON object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def from_validation_error(error: ValidationError, what: str = "request body") -> ApiError:
    """An ApiError naming the first invalid field of a pydantic validation failure."""
    first = error.errors(include_url=False)[0]
    kind = first.get("type", "")
    # Union branches show up in `loc` as type tags ("str", "list[int]"); the client's field path
    # is what remains.
    raw_location = first.get("loc", ())
    location = [str(part) for part in raw_location if not _is_type_tag(part)]
    is_union = len(location) != len(raw_location)
    param = ".".join(location) or None
    if kind == "json_invalid":
        return ApiError(
            f"The {what} is not valid JSON: {first.get('msg')}. Send a JSON object.",
            code="invalid_json",
        )
    if kind == "extra_forbidden":
        return ApiError(
            f"Unsupported parameter {param!r}: ember does not recognise it. Remove it from the request.",
            param=param,
            code="unsupported_parameter",
        )
    if kind == "missing":
        return ApiError(f"Missing required parameter {param!r}.", param=param, code="missing_required_parameter")
    if not location:
        return ApiError(f"The {what} must be a JSON object: {first.get('msg')}.", code="invalid_type")
    if is_union:
        field_name = location[-1] if not location[-1].isdigit() else location[-2]
        expected = _UNION_EXPECTATIONS.get(field_name, "one of the documented types")
        return ApiError(f"Invalid value for {param!r}: expected {expected}.", param=param, code="invalid_type")
    message = first.get("msg", "invalid value")
    # Pydantic prefixes custom validator messages with "Value error, "; the client needs only the reason.
    message = message.removeprefix("Value error, ")
    return ApiError(f"Invalid value for {param!r}: {message}.", param=param, code="invalid_value")


_UNION_EXPECTATIONS = {
    "stop": "a string or a list of strings",
    "prompt": "a non-empty string, list of non-empty strings, list of token ids, or list of non-empty lists of token ids",
    "input": "a non-empty string, list of non-empty strings, list of token ids, or list of non-empty lists of token ids",
    "content": "a string or a list of {'type': 'text', 'text': ...} parts",
}


def _is_type_tag(part: object) -> bool:
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or "[" in part or part[:1].isupper()
                                      or part.startswith("constrained-"))


_HTTP_ERROR_CODES = {
    HTTPStatus.NOT_FOUND: "not_found",
    HTTPStatus.METHOD_NOT_ALLOWED: "method_not_allowed",
    HTTPStatus.REQUEST_TIMEOUT: "request_timeout",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "request_too_large",
}


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure to an OpenAI error body; unexpected ones become a bare 500."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or None
        message = f"Invalid request: {first.get('msg', 'validation failed')}"
        return ApiError(message, param=param, code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{exc.detail}: {request.method} {request.url.path}"
        code = _HTTP_ERROR_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return ApiError(
            message, status_code=exc.status_code, error_type=error_type, code=code, headers=exc.headers
        ).response()

    @app.exception_handler(ClientDisconnect)
    async def _client_disconnect(request: Request, _: ClientDisconnect) -> JSONResponse:
        # Nobody is left to read the answer; this is the client's choice, not a server fault.
        logger.info("client disconnected while sending %s %s", request.method, request.url.path)
        return ApiError(
            "The client disconnected before sending the whole request.", status_code=499, code="client_disconnected"
        ).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error serving %s %s", request.method, request.url.path)
        return ApiError(
            "The server hit an internal error; it has been logged.",
            status_code=HTTPStatus.INTERNAL_SERVER_ERROR,
            error_type="server_error",
            code="internal_error",
        ).response()
