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
