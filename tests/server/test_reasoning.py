"""`--reasoning-parser`: a thinking model's text up to `</think>` comes back as `reasoning_content`, the rest as
`content`, whole or streamed (a tag split across steps included), tool calls read from the content alone."""

from __future__ import annotations

import pytest
from openai import OpenAI

from ember.server.app import build_app
from ember.server.config import ServerConfig
from ember.server.reasoning import ReasoningStream, split_reasoning
from tests.server.fake_engine import FakeEngine
from tests.server.harness import ThreadedServer

THINKING = "<think>\nThe user greets me.</think>\n\nHello there!"


@pytest.mark.parametrize(("parser", "text", "expected"), [
    ("qwen3", THINKING, ("\nThe user greets me.", "\n\nHello there!")),
    ("qwen3", "Hello there!", (None, "Hello there!")),  # thinking off: the template closed an empty one
    ("qwen3", "<think>cut off while thin", ("cut off while thin", "")),
    ("deepseek_r1", "The prompt opened it.</think>Answer", ("The prompt opened it.", "Answer")),
    ("deepseek_r1", "<think>x</think>y", ("x", "y")),
    ("deepseek_r1", "still thinking", ("still thinking", "")),
])  # fmt: skip
def test_a_reply_splits_alike_whole_and_in_any_pieces(parser, text, expected):
    assert split_reasoning(text, parser) == expected
    for size in (1, 2, 3, 7):
        stream, reasoning, content = ReasoningStream(parser), "", ""
        for start in range(0, len(text), size):
            more_reasoning, more_content = stream.feed(text[start : start + size])
            reasoning, content = reasoning + more_reasoning, content + more_content
        more_reasoning, more_content = stream.finish()
        assert ((reasoning + more_reasoning) or None, content + more_content) == expected


@pytest.fixture
def client():
    engine = FakeEngine(step_s=0.0005, max_model_len=256, reply=THINKING)
    with ThreadedServer(build_app(engine, ServerConfig(reasoning_parser="qwen3"))) as server:
        yield OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def test_the_served_reply_carries_its_reasoning_apart(client):
    messages = [{"role": "user", "content": "Hi"}]
    reply = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=len(THINKING))
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == ("\nThe user greets me.", "\n\nHello there!")
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model="fake-model", messages=messages, max_tokens=len(THINKING),
                                                stream=True, logprobs=True):
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == ("\nThe user greets me.", "\n\nHello there!")


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="choose one of deepseek_r1, qwen3"):
        ServerConfig(reasoning_parser="o1")


def test_the_responses_api_lists_the_reasoning_as_its_own_item(client):
    response = client.responses.create(model="fake-model", input="Hi", max_output_tokens=len(THINKING))
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "\nThe user greets me."
    assert message.type == "message" and response.output_text == "\n\nHello there!"
    events = list(client.responses.create(model="fake-model", input="Hi", max_output_tokens=len(THINKING), stream=True))
    thought = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    said = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert (thought, said) == ("\nThe user greets me.", "\n\nHello there!")
    assert {event.output_index for event in events if event.type == "response.output_text.delta"} == {1}
    done = events[-1].response
    assert [item.type for item in done.output] == ["reasoning", "message"]
    # the reasoning item given back as history is accepted (and left out of the prompt)
    follow_up = client.responses.create(model="fake-model", input=[*[item.model_dump(exclude_none=True) for item in done.output],
                                                                  {"role": "user", "content": "And?"}], max_output_tokens=4)
    assert follow_up.status == "incomplete"


def test_include_reasoning_false_leaves_the_reasoning_out_but_not_in_the_content(client):
    messages = [{"role": "user", "content": "Hi"}]
    extra = {"include_reasoning": False}
    reply = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=len(THINKING), extra_body=extra)
    assert getattr(reply.choices[0].message, "reasoning_content", None) is None
    assert reply.choices[0].message.content == "\n\nHello there!"
    chunks = list(client.chat.completions.create(model="fake-model", messages=messages, max_tokens=len(THINKING),
                                                 stream=True, extra_body=extra))
    assert not any(getattr(choice.delta, "reasoning_content", None) for chunk in chunks for choice in chunk.choices)
    assert "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices) == "\n\nHello there!"


def test_tool_calls_are_read_from_the_content_after_the_reasoning():
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    reply = f"<think>I should call the tool.</think>\n{call}"
    engine = FakeEngine(step_s=0.0005, max_model_len=512, reply=reply)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]
    with ThreadedServer(build_app(engine, ServerConfig(reasoning_parser="qwen3"))) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        message = client.chat.completions.create(model="fake-model", messages=messages, tools=tools,
                                                 max_tokens=len(reply)).choices[0].message
        assert message.reasoning_content == "I should call the tool."
        assert [c.function.name for c in message.tool_calls] == ["get_weather"] and not message.content
        chunks = list(client.chat.completions.create(model="fake-model", messages=messages, tools=tools,
                                                     max_tokens=len(reply), stream=True))
        deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "I should call the tool."
        assert [c.function.name for d in deltas for c in d.tool_calls or []] == ["get_weather"]
        assert "tool_call" not in "".join(d.content or "" for d in deltas)


def test_reasoning_effort_reaches_the_chat_template_as_vllm_passes_it():
    template = "{{ reasoning_effort | default('-') }}|{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with ThreadedServer(build_app(FakeEngine(step_s=0.0005), ServerConfig(chat_template=template))) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Hi"}]
        plain = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=1)
        effort = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=1, reasoning_effort="medium")
        assert (plain.usage.prompt_tokens, effort.usage.prompt_tokens) == (len("-|Hi"), len("medium|Hi"))
        response = client.responses.create(model="fake-model", input="Hi", max_output_tokens=1, reasoning={"effort": "low"})
        assert response.usage.input_tokens == len("low|Hi")
