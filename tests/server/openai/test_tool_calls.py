"""Tool calls read back from generated text, and the JSON a forced call is held to (no engine involved)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ember.engine.structured.json_recognizer import JsonRecognizer
from ember.server.common.errors import ApiError
from ember.server.openai.protocol import ChatCompletionRequest
from ember.server.openai.tool_calls import ToolCallStream, finish_reason_with_calls, plan_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                          "required": ["city"], "additionalProperties": False}}}  # fmt: skip
BOOKING = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "properties": {"guest": {"$ref": "#/$defs/Guest"}}, "required": ["guest"], "additionalProperties": False,
    "$defs": {"Guest": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": False}}}}}  # fmt: skip


def plan(tool_choice=None, tools=(WEATHER, BOOKING), parallel_tool_calls=None):
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": list(tools),
                                                    "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls})  # fmt: skip
    return plan_tools(request)


def readable(constraint, text: str) -> bool:
    recognizer = JsonRecognizer(constraint.compile())
    return recognizer.may_end(recognizer.read(recognizer.initial, text.encode()))


def test_auto_reads_hermes_calls_and_keeps_the_text_before_them():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": "book", "arguments": {"guest": {"name": "Ada"}}}</tool_call>'
    before, calls = plan().read(text)
    assert before == "Let me check.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("book", {"guest": {"name": "Ada"}})]
    assert len({c.id for c in calls}) == 2 and finish_reason_with_calls("stop", bool(calls)) == "tool_calls"


@pytest.mark.parametrize("text", ["No tools needed: 42.", "<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>'])
def test_auto_without_a_readable_call_leaves_the_text_as_content(text):
    assert plan().read(text) == (text, [])


def test_a_named_choice_holds_the_reply_to_that_function_s_parameters():
    named = plan({"type": "function", "function": {"name": "get_weather"}})
    constraint = named.constraint()
    assert readable(constraint, '{"city": "Oslo", "unit": "C"}')
    assert not readable(constraint, '{"unit": "C"}')
    _, calls = named.read(' {"city": "Oslo"}')
    assert calls[0].function.name == "get_weather" and calls[0].function.arguments == '{"city": "Oslo"}'


def test_required_holds_the_reply_to_a_list_of_calls_over_every_tool_with_their_definitions_lifted():
    required = plan("required")
    schema = required.constraint().json_schema
    text = '[{"name": "book", "parameters": {"guest": {"name": "Ada"}}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    jsonschema.validate(json.loads(text), schema)  # the reference agrees the lifted $defs still resolve
    assert readable(required.constraint(), text)
    assert not readable(required.constraint(), "[]")
    assert not readable(required.constraint(), '[{"name": "book", "parameters": {"guest": {}}}]')
    _, calls = required.read(text)
    assert [c.function.name for c in calls] == ["book", "get_weather"]
    assert json.loads(calls[0].function.arguments) == {"guest": {"name": "Ada"}}


def test_without_parallel_calls_required_holds_the_reply_to_one_call_and_auto_keeps_the_first():
    two = '[{"name": "book", "parameters": {"guest": {"name": "Ada"}}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    one = '[{"name": "get_weather", "parameters": {"city": "Rome"}}]'
    single = plan("required", parallel_tool_calls=False).constraint()
    assert readable(single, one) and not readable(single, two)
    assert readable(plan("required", parallel_tool_calls=True).constraint(), two)
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><tool_call>{"name": "book", "arguments": {"guest": {"name": "Ada"}}}</tool_call>'
    assert [c.function.name for c in plan(parallel_tool_calls=False).read(text)[1]] == ["get_weather"]
    assert [c.function.name for c in plan().read(text)[1]] == ["get_weather", "book"]


@pytest.mark.parametrize(("body", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
])  # fmt: skip
def test_a_choice_the_tools_cannot_honour_is_a_400_naming_it(body, param):
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})
    with pytest.raises(ApiError) as raised:
        plan_tools(request)
    assert raised.value.param == param


def test_a_stream_shows_text_until_a_call_may_begin_and_hands_the_calls_over_at_the_end():
    reader = ToolCallStream(plan())
    pieces = [reader.content(delta) for delta in ["Sure", ". <tool", "_call>", '{"name": "get_weather", "arguments": {"city": "Lima"}}', "</tool_call>"]]
    assert pieces == ["Sure", ". ", "", "", ""]
    rest, calls = reader.finish()
    assert rest == "" and calls[0].function.name == "get_weather"
    plain = ToolCallStream(plan())
    assert plain.content("a <to") == "a " and plain.finish() == ("<to", [])
    forced = ToolCallStream(plan("required"))
    assert forced.content('[{"name": "get_weather", "parameters": {"city": "X"}}]') == ""
    assert forced.finish()[1][0].function.name == "get_weather"


def test_auto_reads_a_reply_that_is_only_a_declared_tool_s_json_and_nothing_else_bare():
    _, calls = plan().read(' {"name": "get_weather", "parameters": {"city": "Bern"}}\n')
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Bern"}
    assert plan().read('{"name": "unknown_tool", "arguments": {}}')[1] == []
    assert plan().read('{"name": "get_weather"}')[1] == []


def test_auto_reads_mistral_s_list_of_calls_and_a_stream_holds_back_its_marker():
    text = 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "book", "arguments": {"guest": {"name": "B"}}}]'
    before, calls = plan().read(text)
    assert before == "Checking." and [c.function.name for c in calls] == ["get_weather", "book"]
    reader = ToolCallStream(plan())
    assert [reader.content(d) for d in ["Checking.", "[TOOL", "_CALLS]", text[len("Checking.[TOOL_CALLS]"):]]] == ["Checking.", "", "", ""]
    assert reader.finish()[1][1].function.name == "book"
    assert ToolCallStream(plan()).content("a [TOO") == "a "
