"""Tool calling on `/v1/chat/completions`: what a request's `tools` and `tool_choice` ask of the engine,
and the tool calls read back from what it generated.

`tool_choice` "none" and "auto" (the default when tools are given) generate freely, the tools rendered
into the prompt by the model's chat template; "auto" then reads the calls the model wrote in the Hermes
format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, what Qwen2.5, Hermes and other
templates ask for; special tokens are kept in the text for it), Mistral's (`[TOOL_CALLS][{...}, ...]`),
or a reply that is nothing but one call's JSON naming a declared tool (Llama 3.1's JSON format). A named function, or "required", holds the reply to JSON token by token (a
structured output), so the calls are valid whatever the model: the function's parameters schema, or a
non-empty array of `{"name", "parameters"}` objects over every tool.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ember.engine.structured import SchemaError, StructuredOutput
from ember.server.common.errors import ApiError
from ember.server.openai.protocol import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
)

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALLS_LIST = "[TOOL_CALLS]"  # Mistral's: a JSON list of calls follows
CALL_MARKERS = (CALL_OPEN, CALLS_LIST)
HERMES_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolPlan:
    """A request's tools (as the chat template takes them) and how the reply may call them:
    `mode` is none, auto, required or named (then `function` is the name); `parallel` False (OpenAI's
    `parallel_tool_calls`) allows one call per reply: "required" generates one, "auto" keeps the first."""

    tools: list[dict[str, Any]]
    mode: str
    function: str | None = None
    parallel: bool = True

    @property
    def is_constrained(self) -> bool:
        return self.mode in ("required", "named")

    def constraint(self) -> StructuredOutput | None:
        """The structured output a forced call needs (None for none and auto)."""
        if not self.is_constrained:
            return None
        try:
            if self.mode == "named":
                parameters = self._parameters(self.function)
                return StructuredOutput(json_schema=parameters) if parameters else StructuredOutput(json_object=True)
            return StructuredOutput(json_schema=self._any_calls_schema())
        except SchemaError as error:
            raise ApiError(f"Invalid tools: {error}.", param="tools", code="invalid_value") from error

    def read(self, text: str) -> tuple[str, list[ToolCall]]:
        """(the text before any call, the calls) of a finished reply; no calls leaves all the text."""
        if self.mode == "named":
            return "", [_call(self.function, text.strip())]
        if self.mode == "required":
            return _read_json_calls(text)
        if self.mode == "auto":
            before, calls = _read_marked_calls(text, {tool["function"]["name"] for tool in self.tools})
            return before, calls if self.parallel else calls[:1]
        return text, []

    def _parameters(self, name: str) -> dict[str, Any] | None:
        return next(tool["function"].get("parameters") for tool in self.tools if tool["function"]["name"] == name)

    def _any_calls_schema(self) -> dict[str, Any]:
        """A non-empty array of calls, each one tool's name and its parameters (their $defs lifted to the root)."""
        options, definitions = [], {}
        for tool in self.tools:
            name = tool["function"]["name"]
            parameters = _prefixed_refs(dict(tool["function"].get("parameters") or {"type": "object"}), name, definitions)
            options.append({"type": "object", "properties": {"name": {"const": name}, "parameters": parameters},
                            "required": ["name", "parameters"], "additionalProperties": False})  # fmt: skip
        most = {} if self.parallel else {"maxItems": 1}
        return {"type": "array", "minItems": 1, **most, "items": {"anyOf": options}, **({"$defs": definitions} if definitions else {})}


def plan_tools(request: ChatCompletionRequest) -> ToolPlan | None:
    """The request's ToolPlan (None without tools); 400 for a choice its tools cannot honour."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none"):
            raise ApiError("'tool_choice' needs 'tools': give the functions the reply may call.", param="tool_choice",
                           code="invalid_value")  # fmt: skip
        return None
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise ApiError("Tool function names must be unique.", param="tools", code="invalid_value")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise ApiError(f"tool_choice names {choice.function.name!r}, which is not among the tools {names}.",
                           param="tool_choice", code="invalid_value")  # fmt: skip
        return ToolPlan(tools, "named", choice.function.name)
    return ToolPlan(tools, choice or "auto", parallel=request.parallel_tool_calls is not False)


def finish_reason_with_calls(finish_reason: str | None, has_calls: bool) -> str | None:
    """OpenAI's `tool_calls` when a finished reply called tools (a reply cut by the token limit stays `length`)."""
    return "tool_calls" if has_calls and finish_reason == "stop" else finish_reason


def _call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=arguments))


def _item_call(item: dict[str, Any]) -> ToolCall:
    """A call written as `{"name", "arguments" (or "parameters"): object or JSON text}` (KeyError/TypeError if not)."""
    arguments = item["arguments"] if "arguments" in item else item["parameters"]
    return _call(item["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))


NOT_A_CALL = (json.JSONDecodeError, AttributeError, KeyError, TypeError)


def _read_json_calls(text: str) -> tuple[str, list[ToolCall]]:
    try:
        return "", [_item_call(item) for item in json.loads(text)]
    except NOT_A_CALL:  # cut short by the token limit
        return text, []


def _read_marked_calls(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """Calls after the first marker (Hermes blocks or Mistral's list), or a bare call's JSON; else none."""
    start = _first_marker(text)
    if start < 0:
        return _read_bare_call(text, names)
    if text.startswith(CALLS_LIST, start):
        return _read_call_list(text, start)
    try:
        return text[:start], [_item_call(json.loads(match.group(1))) for match in HERMES_CALL.finditer(text, start)]
    except NOT_A_CALL:
        return text, []  # not a call after all: the text stands as written


def _first_marker(text: str) -> int:
    found = [index for index in (text.find(marker) for marker in CALL_MARKERS) if index >= 0]
    return min(found, default=-1)


def _read_call_list(text: str, start: int) -> tuple[str, list[ToolCall]]:
    try:
        items, _ = json.JSONDecoder().raw_decode(text[start + len(CALLS_LIST) :].lstrip())
        return text[:start], [_item_call(item) for item in items]
    except NOT_A_CALL:
        return text, []


def _read_bare_call(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """A reply that is nothing but one call's JSON naming a declared tool (what Llama 3.1's JSON tool format
    writes, and some models without their markers); any other text stands as written."""
    try:
        item = json.loads(text)
        if item.get("name") in names and isinstance(item.get("arguments", item.get("parameters")), dict):
            return "", [_item_call(item)]
    except NOT_A_CALL:
        pass
    return text, []


def _prefixed_refs(schema: Any, prefix: str, definitions: dict[str, Any]) -> Any:
    """`schema` with its local `$defs` / `definitions` moved into `definitions` as `prefix.NAME`, refs rewritten."""
    if isinstance(schema, list):
        return [_prefixed_refs(item, prefix, definitions) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rewritten = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions") and isinstance(value, dict):
            for name, definition in value.items():
                definitions[f"{prefix}.{name}"] = _prefixed_refs(definition, prefix, definitions)
        elif key == "$ref" and isinstance(value, str) and value.startswith(("#/$defs/", "#/definitions/")):
            rewritten[key] = f"#/$defs/{prefix}.{value.split('/', 2)[2]}"
        else:
            rewritten[key] = _prefixed_refs(value, prefix, definitions)
    return rewritten


class ToolCallStream:
    """One streamed choice under a ToolPlan: the content it may show as it comes, and at the end the rest
    and its calls. Auto mode holds back what could be the start of a `<tool_call>`; a forced call's JSON is
    never content. A named function's arguments stream as they are generated (`named_call_delta`)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.shown = 0
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"

    @property
    def streams_arguments(self) -> bool:
        return self.plan.mode == "named"

    def named_call_delta(self, delta: str) -> DeltaToolCall | None:
        """The named call's next piece: the first names it (id, function), each carries its arguments so far."""
        is_first = not self.text
        self.text += delta
        piece = delta.lstrip() if is_first else delta
        if not piece and not is_first:
            return None
        return DeltaToolCall(index=0, id=self.call_id if is_first else None, type="function" if is_first else None,
                             function=DeltaFunctionCall(name=self.plan.function if is_first else None, arguments=piece))  # fmt: skip

    def content(self, delta: str) -> str:
        self.text += delta
        end = self._showable_end()
        piece = self.text[self.shown : end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return piece

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(the content not shown yet, the calls) once the choice has finished."""
        before, calls = self.plan.read(self.text)
        return (before if calls else self.text)[self.shown :], calls

    def _showable_end(self) -> int:
        if self.plan.is_constrained:
            return 0
        if self.plan.mode == "none":
            return len(self.text)
        start = _first_marker(self.text)
        if start >= 0:
            return start
        longest = max(len(marker) for marker in CALL_MARKERS) - 1
        held = next((n for n in range(min(longest, len(self.text)), 0, -1)
                     if any(marker.startswith(self.text[-n:]) for marker in CALL_MARKERS)), 0)  # fmt: skip
        return len(self.text) - held
