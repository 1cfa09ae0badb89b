"""Semantic cache: exact and near-identical prompts hit within a tenant, never across tenants,
never for sampled requests unless asked; entries expire; hits are free and counted."""

from __future__ import annotations

import httpx

from ember.gateway.app import build_app
from ember.gateway.cache import SemanticCache
from ember.gateway.config import CacheConfig, config_from_dict, hash_key
from tests.gateway.backends import FakeBackend
from tests.gateway.harness import ThreadedApp
from tests.server.harness import parse_sse

QUESTION = "What is the capital of France, and why is it famous?"


def cached_gateway(backend: FakeBackend, tmp_path) -> ThreadedApp:
    config = {
        "backends": [{"name": "a", "url": backend.url}],
        "models": [{"name": "m", "backends": ["a"]}],
        "keys": [
            {"name": "alice", "key_sha256": hash_key("sk-alice"), "tenant": "tenant-a"},
            {"name": "alice-2", "key_sha256": hash_key("sk-alice-2"), "tenant": "tenant-a"},
            {"name": "bob", "key_sha256": hash_key("sk-bob"), "tenant": "tenant-b"},
        ],
        "cache": {"enabled": True, "similarity_threshold": 0.9},
        "store": {"path": str(tmp_path / "gw.sqlite3")},
    }
    return ThreadedApp(build_app(config_from_dict(config)))


def ask(gateway, key: str, content: str = QUESTION, headers: dict | None = None, **extra) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 16, "temperature": 0, **extra}
    return httpx.post(
        gateway.base_url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}", **(headers or {})}, timeout=10
    )


def test_a_tenant_never_receives_another_tenants_cached_answer(tmp_path):
    with FakeBackend("a") as backend, cached_gateway(backend, tmp_path) as gateway:
        first = ask(gateway, "sk-alice")
        same_tenant = ask(gateway, "sk-alice-2")
        other_tenant = ask(gateway, "sk-bob")
        metrics = httpx.get(gateway.base_url + "/metrics").text
    assert "x-ember-cache" not in first.headers
    assert same_tenant.headers["x-ember-cache"] == "hit" and same_tenant.json() == first.json()
    assert "x-ember-cache" not in other_tenant.headers
    assert backend.record.requests == 2
    assert 'ember_gateway_cache_lookups_total{model="m",result="hit"} 1.0' in metrics
    assert first.json()["usage"]["total_tokens"] == 11 + 13  # question words + "a says:" and the question
    assert 'ember_gateway_cache_saved_tokens_total{model="m"} 24.0' in metrics


def test_near_identical_prompts_hit_and_different_ones_miss(tmp_path):
    with FakeBackend("a") as backend, cached_gateway(backend, tmp_path) as gateway:
        ask(gateway, "sk-alice")
        near = ask(gateway, "sk-alice", content="what is the capital of France and why is it famous")
        different = ask(gateway, "sk-alice", content="How many legs does a spider have?")
        other_settings = ask(gateway, "sk-alice", max_tokens=8)
    assert near.headers["x-ember-cache"] == "hit" and float(near.headers["x-ember-cache-similarity"]) >= 0.9
    assert "x-ember-cache" not in different.headers and "x-ember-cache" not in other_settings.headers
    assert backend.record.requests == 3


def test_sampled_requests_are_not_cached_unless_asked(tmp_path):
    with FakeBackend("a") as backend, cached_gateway(backend, tmp_path) as gateway:
        ask(gateway, "sk-alice", temperature=0.7)
        sampled_again = ask(gateway, "sk-alice", temperature=0.7)
        ask(gateway, "sk-alice", temperature=0.7, content="opt in", headers={"x-ember-cache": "on"})
        opted_in = ask(gateway, "sk-alice", temperature=0.7, content="opt in", headers={"x-ember-cache": "on"})
    assert "x-ember-cache" not in sampled_again.headers
    assert opted_in.headers["x-ember-cache"] == "hit"
    assert backend.record.requests == 3


def test_a_cached_answer_is_replayed_as_a_stream(tmp_path):
    with FakeBackend("a") as backend, cached_gateway(backend, tmp_path) as gateway:
        streamed = ask(gateway, "sk-alice", stream=True)
        replay = ask(gateway, "sk-alice", stream=True, stream_options={"include_usage": True})
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in parse_sse(streamed.text)[:-1] if e["choices"])
    events = parse_sse(replay.text)
    replayed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert replay.headers["x-ember-cache"] == "hit" and replayed == text == "a says: " + QUESTION
    assert events[-2]["usage"]["completion_tokens"] == 13 and events[-1] == "[DONE]"
    assert backend.record.requests == 1


def test_entries_expire_after_their_ttl():
    now = [0.0]
    cache = SemanticCache(CacheConfig(enabled=True, ttl_s=10), clock=lambda: now[0])
    cache.store("scope", "prompt", {"answer": 1})
    now[0] = 9.9
    assert cache.lookup("scope", "prompt").response == {"answer": 1}
    assert cache.lookup("other scope", "prompt") is None
    now[0] = 10.0
    assert cache.lookup("scope", "prompt") is None
