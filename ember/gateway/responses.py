"""What the gateway needs to know of OpenAI's Responses API (`POST /v1/responses`) stream events.

A streamed response is a sequence of typed events (`{"type": ..., "sequence_number": n, ...}`):
openings (`response.created`, `response.in_progress`, an output item and its content part added),
then deltas (`response.output_text.delta`, `response.function_call_arguments.delta`), `.done`
events, and one final event (`response.completed`, `response.incomplete` or `response.failed`)
whose `response` carries the usage. Its servers refuse `stream_options`, and OpenAI's own ends
the body after the final event while ember's then sends `data: [DONE]`.
"""

from __future__ import annotations

RESPONSES_ENDPOINT = "/responses"

# Events a server sends before generating anything: a backend that fails after them can still be retried.
OPENING_EVENTS = frozenset(
    {"response.created", "response.queued", "response.in_progress", "response.output_item.added", "response.content_part.added"}
)
# Each carries at least one generated token (the stream meter counts one per event).
DELTA_EVENTS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
# The events that end a stream; each carries the whole response, usage included.
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def event_type(event: dict) -> str:
    """The event's `type`, or "" for a chunk without one (an `{"error": ...}` chunk)."""
    kind = event.get("type")
    return kind if isinstance(kind, str) else ""


def is_final_event(event: dict) -> bool:
    return event_type(event) in FINAL_EVENTS


def carries_output(event: dict) -> bool:
    """Whether a stream has gone past its openings: a delta, a `.done` or a final event, or a chunk
    without a type (an `{"error": ...}` chunk)."""
    return event_type(event) not in OPENING_EVENTS


def final_usage(event: dict) -> dict | None:
    """The usage object a final event's response carries, or None for any other event."""
    if not is_final_event(event):
        return None
    response = event.get("response")
    return response.get("usage") if isinstance(response, dict) else None
