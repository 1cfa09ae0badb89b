"""Response bodies: SSE in the OpenAI streaming format (`data: {json}` events, then `data: [DONE]`) and JSON."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from ember.server.common.drain import Drain
from ember.server.common.errors import ApiError, error_body

logger = logging.getLogger("ember.server")

DONE_EVENT = "data: [DONE]\n\n"


def event(payload: BaseModel | dict) -> str:
    """One SSE event carrying `payload` as JSON."""
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


async def guarded_events(events: AsyncIterator[str], on_close: Callable[[], None], drain: Drain) -> AsyncIterator[str]:
    """`events` then `[DONE]`; a failure after headers went out, or the end of the shutdown grace
    period, becomes an error event, never a traceback or a cut stream."""
    bounded = drain.until_expired(events)
    try:
        async for item in bounded:
            yield item
    except ApiError as error:
        yield event(error.body())
    except Exception:
        logger.exception("internal error while streaming a response")
        message = "The server hit an internal error; it has been logged."
        yield event(error_body(message, "server_error", None, "internal_error"))
    finally:
        await bounded.aclose()
        await events.aclose()
        on_close()
    yield DONE_EVENT


def model_response(payload: BaseModel) -> Response:
    """A JSON response of a response model (pydantic writes non-finite floats as null)."""
    return Response(payload.model_dump_json(), media_type="application/json")


def sse_response(events: AsyncIterator[str], on_close: Callable[[], None], drain: Drain) -> StreamingResponse:
    """A streaming response of `events`; `on_close` runs exactly when the stream ends, however it ends."""
    closed = False

    def close_once() -> None:
        nonlocal closed
        if not closed:
            closed = True
            on_close()

    return StreamingResponse(
        guarded_events(events, close_once, drain),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(close_once),
    )
