"""OpenAI-style error responses of the gateway: one exception type, one JSON body."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class GatewayError(Exception):
    """A request the gateway will not serve, with the OpenAI error fields that say why."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.error_type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error JSON object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def install_error_handlers(app: FastAPI) -> None:
    """GatewayError and HTTP errors answer in the OpenAI format; nothing leaks a traceback."""

    @app.exception_handler(GatewayError)
    async def on_gateway_error(_: Request, error: GatewayError) -> JSONResponse:
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail), "invalid_request_error"), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, error: Exception) -> JSONResponse:
        return JSONResponse(error_body(f"internal gateway error: {type(error).__name__}", "server_error"), status_code=500)
