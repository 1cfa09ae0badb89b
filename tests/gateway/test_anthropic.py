"""Anthropic Messages, both ways: OpenAI clients served by a server speaking the Messages wire
format, and the official `anthropic` client served by an OpenAI-compatible backend."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict, hash_key
from ember.gateway.sqlite_store import SQLiteStore
from tests.gateway.backends import FakeBackend
from tests.gateway.harness import ThreadedApp


@pytest.fixture
def gateway(tmp_path):
    with FakeBackend("claude", kind="anthropic") as claude, FakeBackend("a") as openai_backend:
        config = {
            "backends": [
                {"name": "claude", "url": claude.url, "kind": "anthropic", "api_key": "sk-upstream"},
                {"name": "a", "url": openai_backend.url},
            ],
            "models": [
                {"name": "claude-x", "backends": [{"backend": "claude", "model": "claude-upstream"}]},
                {"name": "local", "backends": ["a"]},
            ],
            "keys": [{"name": "k", "key_sha256": hash_key("sk-k")}],
            "store": {"path": str(tmp_path / "gw.sqlite3")},
        }
        with ThreadedApp(build_app(config_from_dict(config))) as app:
            yield app, claude, openai_backend


def test_openai_chat_is_translated_to_messages_and_back(gateway):
    app, claude, _ = gateway
    client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="sk-k", max_retries=0)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name three colours"}]
    reply = client.chat.completions.create(model="claude-x", messages=messages, max_tokens=4, stop=["."], temperature=0)
    sent = claude.record.bodies[0]
    assert sent["headers"]["x-api-key"] == "sk-upstream" and sent["headers"]["anthropic-version"] == "2023-06-01"
    assert {k: sent[k] for k in ("model", "system", "messages", "max_tokens", "stop_sequences", "temperature")} == {
        "model": "claude-upstream", "system": "be brief", "messages": [{"role": "user", "content": "name three colours"}],
        "max_tokens": 4, "stop_sequences": ["."], "temperature": 0,
    }  # fmt: skip
    assert reply.choices[0].message.content == "claude says: name three"
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 4)


def test_a_messages_stream_becomes_openai_chunks_with_usage(gateway, tmp_path):
    app, _, _ = gateway
    client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="sk-k", max_retries=0)
    stream = client.chat.completions.create(
        model="claude-x", messages=[{"role": "user", "content": "hello there"}], max_tokens=10, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "claude says: hello there"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 4)


def test_the_anthropic_client_is_served_by_an_openai_backend(gateway, tmp_path):
    app, _, openai_backend = gateway
    client = anthropic.Anthropic(base_url=app.base_url, api_key="sk-k", max_retries=0)
    message = client.messages.create(model="local", max_tokens=16, system="sys", messages=[{"role": "user", "content": "one two"}])
    assert message.content[0].text == "a says: one two" and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 4)
    assert openai_backend.record.bodies[0]["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "one two"}]
    with client.messages.stream(model="local", max_tokens=3, messages=[{"role": "user", "content": "x y z"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "a says: x" and final.stop_reason == "max_tokens" and final.usage.output_tokens == 3
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=app.base_url, api_key="sk-wrong", max_retries=0).messages.create(
            model="local", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    store = SQLiteStore(str(tmp_path / "gw.sqlite3"))
    rows = asyncio.run(store.ledger(hash_key("sk-k")))
    asyncio.run(store.close())
    assert [(row.prompt_tokens, row.completion_tokens) for row in rows] == [(3, 4), (3, 3)]
