"""`--reasoning-parser`: a thinking model's text up to `</think>` comes back as `reasoning_content`, the rest as
`content`, whole or streamed (a tag split across steps included), tool calls read from the content alone."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai import OpenAI

from ember.engine.engine_request import EngineRequest
from ember.engine.outputs import OutputAccumulator
from ember.engine.sampling_params import SamplingParams
from ember.engine.structured import StructuredOutput
from ember.server.config import ServerConfig
from ember.server.openai.reasoning import ReasoningStream, split_reasoning
from ember.server.responses.models import ResponsesRequest
from ember.server.responses.serving import ResponseEvents, _finished, _shell
from tests.server.harness import ThreadedServer
from tests.server.real_engine import GREEDY, MODEL, RecordingEngine, tiny_app

THINKING = "<think>\nThe user greets me.</think>\n\nHello there!"


def writing(text: str) -> dict:
    """Request fields that hold the model to writing `text` (its only choice), greedily."""
    return {"max_tokens": len(text), **GREEDY, "extra_body": {"guided_choice": [text]}}


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


@pytest.fixture(scope="module")
def client(engine: RecordingEngine):
    with ThreadedServer(tiny_app(engine, reasoning_parser="qwen3")) as server:
        yield OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def test_the_served_reply_carries_its_reasoning_apart(client):
    messages = [{"role": "user", "content": "Hi"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, **writing(THINKING))
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == ("\nThe user greets me.", "\n\nHello there!")
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True, logprobs=True, **writing(THINKING)):
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == ("\nThe user greets me.", "\n\nHello there!")


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="choose one of deepseek_r1, qwen3"):
        ServerConfig(reasoning_parser="o1")


def test_the_responses_api_lists_the_reasoning_as_its_own_item(client, engine: RecordingEngine):
    """The Responses API's request carries no output constraint, so the engine's deltas (held to THINKING) are
    written as a response directly, whole and as events."""
    params = SamplingParams(temperature=0, max_tokens=len(THINKING), structured_output=StructuredOutput(choice=(THINKING,)))
    shell = _shell(ResponsesRequest(input="Hi"), MODEL, None, params)

    async def deltas():
        async for delta in engine.generate(EngineRequest("thinking", engine.tokenizer.encode("Hi"), params)):
            yield delta

    async def run():
        return [event async for event in ResponseEvents(shell, None, "qwen3").events(deltas())]

    accumulator = OutputAccumulator("thinking", 1)
    asyncio.run(_accumulate(accumulator, deltas()))
    response = _finished(shell, accumulator.result(), None, "qwen3")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "\nThe user greets me."
    assert message.type == "message" and message.content[0].text == "\n\nHello there!"
    events = [json.loads(line.removeprefix("data: ")) for event in asyncio.run(run()) for line in event.splitlines()
              if line.startswith("data: ")]  # fmt: skip
    thought = "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta")
    said = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert (thought, said) == ("\nThe user greets me.", "\n\nHello there!")
    assert {event["output_index"] for event in events if event["type"] == "response.output_text.delta"} == {1}
    done = events[-1]["response"]
    assert [item["type"] for item in done["output"]] == ["reasoning", "message"]
    # the reasoning item given back as history is accepted (and left out of the prompt)
    history = [{key: value for key, value in item.items() if value is not None} for item in done["output"]]
    follow_up = client.responses.create(model=MODEL, input=[*history, {"role": "user", "content": "And?"}], max_output_tokens=4,
                                        temperature=0)
    assert follow_up.status == "incomplete"


async def _accumulate(accumulator: OutputAccumulator, deltas) -> None:
    async for delta in deltas:
        accumulator.add(delta)


def test_include_reasoning_false_leaves_the_reasoning_out_but_not_in_the_content(client):
    messages = [{"role": "user", "content": "Hi"}]
    extra = {"include_reasoning": False}
    fields = writing(THINKING)
    fields["extra_body"] = {**fields["extra_body"], **extra}
    reply = client.chat.completions.create(model=MODEL, messages=messages, **fields)
    assert getattr(reply.choices[0].message, "reasoning_content", None) is None
    assert reply.choices[0].message.content == "\n\nHello there!"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True, **fields))
    assert not any(getattr(choice.delta, "reasoning_content", None) for chunk in chunks for choice in chunk.choices)
    assert "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices) == "\n\nHello there!"


def test_tool_calls_are_read_from_the_content_after_the_reasoning(client):
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    reply = f"<think>I should call the tool.</think>\n{call}"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    message = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, **writing(reply)).choices[0].message
    assert message.reasoning_content == "I should call the tool."
    assert [c.function.name for c in message.tool_calls] == ["get_weather"] and not message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=tools, stream=True, **writing(reply)))
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "I should call the tool."
    assert [c.function.name for d in deltas for c in d.tool_calls or []] == ["get_weather"]
    assert "tool_call" not in "".join(d.content or "" for d in deltas)


def test_reasoning_effort_reaches_the_chat_template_as_vllm_passes_it(engine: RecordingEngine):
    template = "{{ reasoning_effort | default('-') }}|{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with ThreadedServer(tiny_app(engine, chat_template=template)) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Hi"}]
        plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
        effort = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, reasoning_effort="medium")
        count = [len(engine.tokenizer.encode(text)) for text in ("-|Hi", "medium|Hi", "low|Hi")]
        assert (plain.usage.prompt_tokens, effort.usage.prompt_tokens) == (count[0], count[1])
        response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, reasoning={"effort": "low"})
        assert response.usage.input_tokens == count[2]
