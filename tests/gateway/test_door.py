"""The door: every malformed request body is a 400 naming the field (OpenAI's error shape, or
Anthropic's on /v1/messages) before anything is reserved or forwarded; bodies past the configured
size or depth get 413 / 400; a zero max_tokens passes as sent."""

from __future__ import annotations

import json

import httpx
import pytest

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict, hash_key
from tests.gateway.backends import FakeBackend
from tests.gateway.harness import ThreadedApp
from tests.server.harness import assert_openai_error

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
DEEP = "[" * 100_000 + "]" * 100_000

# (route, body (a dict, or raw text), the field the error must name): the 13 crashes, then more.
MALFORMED = [
    ("/v1/chat/completions", {**CHAT, "messages": "Hi"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [1, 2]}, "messages[0]"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "abc"}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": [1]}, "max_tokens"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1] + ', "max_tokens": Infinity}', "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": "two"}, "n"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 10**30}, "max_tokens"),
    ("/v1/completions", {"model": "m", "prompt": 5}, "prompt"),
    ("/v1/completions", {"model": "m", "prompt": [None]}, "prompt"),
    ("/v1/chat/completions", '{"model": "m", "messages": ' + DEEP + "}", None),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": "Hi"}, "messages"),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    # budget-moving values: negative, zero where invalid, fractional, non-finite, absurd
    ("/v1/chat/completions", {**CHAT, "max_tokens": -1_000_000_000}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 8.5}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": -3}, "n"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
    ("/v1/chat/completions", {**CHAT, "n": 10**6}, "n"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1] + ', "temperature": NaN}', "temperature"),
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": -5}, "max_tokens"),
    ("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": -1}, "max_output_tokens"),
    ("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ("/v1/responses", {"model": "m", "input": 7}, "input"),
    ("/v1/embeddings", {"model": "m", "input": [None]}, "input"),
    ("/v1/messages", {"model": "m", "max_tokens": -1, "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("door")
    with FakeBackend("a") as backend:
        config = {
            "backends": [{"name": "a", "url": backend.url}],
            "models": [{"name": "m", "backends": ["a"], "price": {"input_per_million": 1.0, "output_per_million": 2.0}}],
            "keys": [{"name": "k", "key_sha256": hash_key("sk-k"), "budget_usd": 1.0}],
            "admin_key_sha256": hash_key("sk-admin"),
            "limits": {"max_body_bytes": 1 << 20, "max_json_depth": 8},
            "store": {"path": str(folder / "gw.sqlite3")},
        }
        with ThreadedApp(build_app(config_from_dict(config))) as app:
            yield app, backend


def usage(app: ThreadedApp) -> tuple[int, int]:
    """(committed, spent) nano-USD of the test key, from the admin route."""
    totals = httpx.get(app.base_url + "/admin/keys/k/usage", headers={"authorization": "Bearer sk-admin"}).json()
    return totals["committed_nano_usd"], totals["spent_nano_usd"]


def post(app: ThreadedApp, route: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"authorization": "Bearer sk-k", "content-type": "application/json"}
    return httpx.post(app.base_url + route, content=content, headers=headers, timeout=30)


@pytest.mark.parametrize(("route", "body", "param"), MALFORMED, ids=[f"{index}-{case[2]}" for index, case in enumerate(MALFORMED)])
def test_a_malformed_body_is_a_400_naming_the_field_and_reserves_nothing(gateway, route, body, param):
    app, backend = gateway
    before, committed = backend.record.requests, usage(app)
    response = post(app, route, body)
    if route == "/v1/messages":
        assert response.status_code == 400, response.text
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
        assert f"`{param}`" in response.json()["error"]["message"]
    else:
        error = assert_openai_error(response, 400)
        assert error["param"] == param
        assert error["code"] == ("too_deeply_nested" if param is None else error["code"])
    assert backend.record.requests == before and usage(app) == committed
    assert httpx.get(app.base_url + "/health").status_code == 200


def test_bodies_past_the_configured_size_get_413_and_past_the_depth_400(gateway):
    app, backend = gateway
    before = backend.record.requests
    large = post(app, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * (1 << 20)}]})
    nested = post(app, "/v1/chat/completions", {**CHAT, "metadata": {"a": [[[[[[[1]]]]]]]}})
    shallow = post(app, "/v1/chat/completions", {**CHAT, "max_tokens": 4, "metadata": {"a": [[[[[1]]]]]}})
    assert assert_openai_error(large, 413)["code"] == "request_too_large"
    assert assert_openai_error(nested, 400)["code"] == "too_deeply_nested"
    assert shallow.status_code == 200, shallow.text
    assert backend.record.requests == before + 1


def test_max_tokens_zero_with_echo_is_passed_as_sent(gateway):
    app, backend = gateway
    response = post(app, "/v1/completions", {"model": "m", "prompt": "score me", "max_tokens": 0, "echo": True})
    assert response.status_code == 200, response.text
    assert backend.record.bodies[-1]["max_tokens"] == 0


def test_a_content_part_with_null_text_counts_as_no_text(gateway):
    app, backend = gateway
    parts = [{"type": "text", "text": None}, {"type": "text", "text": "Hi"}]
    response = post(app, "/v1/chat/completions", {**CHAT, "max_tokens": 4, "messages": [{"role": "user", "content": parts}]})
    assert response.status_code == 200, response.text
    assert backend.record.bodies[-1]["messages"][0]["content"] == parts
