"""A Responses API request as the chat completion it amounts to: instructions and input items become
messages, function tools the nested chat form, `text.format` a response_format. The chat path then
checks, renders, constrains and generates it, so both APIs answer a conversation the same way."""

from __future__ import annotations

import json
from typing import Any

from ember.server.common.errors import ApiError
from ember.server.openai.engine_requests import parse_request
from ember.server.openai.protocol import ChatCompletionRequest
from ember.server.responses.models import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    NamedFunctionChoice,
    ResponsesRequest,
    TextFormat,
)

# Fields ember does not implement, each with what the 400 says is missing (set to a no-op value, they pass).
UNSUPPORTED = {
    "conversation": "stored conversations (send the whole conversation as input)",
    "include": "extra output data ('include')",
    "background": "background responses",
    "max_tool_calls": "a limit on built-in tool calls",
    "top_logprobs": "logprobs on the Responses API (use /v1/chat/completions)",
    "prompt": "stored prompt templates",
}
NO_OP = (None, [], False, 0)


def check_responses_request(request: ResponsesRequest) -> None:
    """Refuse, naming it, every field set to something ember cannot do."""
    for name, what in UNSUPPORTED.items():
        if getattr(request, name) not in NO_OP:
            raise ApiError(f"Unsupported parameter {name!r}: ember does not support {what}. Remove it from the request.",
                           param=name, code="unsupported_parameter")  # fmt: skip
    if isinstance(request.input, list) and not request.input:
        raise ApiError("'input' must not be an empty list.", param="input", code="invalid_value")


def as_chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request this response amounts to (validated as any chat request is)."""
    chat: dict[str, Any] = {"messages": chat_messages(request), "stream": False}
    for ours, theirs in (("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("parallel_tool_calls", "parallel_tool_calls"), ("user", "user")):  # fmt: skip
        if getattr(request, ours) is not None:
            chat[theirs] = getattr(request, ours)
    if request.tools:
        chat["tools"] = [{"type": "function", "function": tool.model_dump(exclude_none=True, exclude={"type"})} for tool in request.tools]
    if request.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(request.tool_choice)
    if request.reasoning is not None and request.reasoning.effort is not None:
        chat["reasoning_effort"] = request.reasoning.effort
    text_format = request.text.format if request.text is not None else None
    if text_format is not None and text_format.type != "text":
        chat["response_format"] = _response_format(text_format)
    return parse_request(ChatCompletionRequest, json.dumps(chat).encode())


def chat_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """`instructions` as a system turn, then the input: text as a user turn; messages as they are; calls
    made earlier as an assistant turn's tool_calls (adjacent calls in one turn); their results as tool turns;
    reasoning items are left out (thinking models' templates drop earlier turns' reasoning)."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        return [*messages, {"role": "user", "content": request.input}]
    for item in request.input:
        if isinstance(item, InputMessage):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return messages


def _chat_tool_choice(choice: str | NamedFunctionChoice) -> str | dict[str, Any]:
    if isinstance(choice, NamedFunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _response_format(text_format: TextFormat) -> dict[str, Any]:
    if text_format.type == "json_object":
        return {"type": "json_object"}
    if text_format.json_schema is None:
        raise ApiError("text.format of type 'json_schema' needs 'schema' (and a 'name').", param="text.format.schema",
                       code="invalid_value")  # fmt: skip
    return {"type": "json_schema", "json_schema": {"name": text_format.name or "output", "schema": text_format.json_schema}}
