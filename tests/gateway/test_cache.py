"""Semantic cache: exact and near-identical prompts hit within a tenant, never across tenants,
never for sampled requests unless asked; entries expire; hits are free and counted."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from ember.gateway.app import build_app
from ember.gateway.cache import LocalEntries, SemanticCache
from ember.gateway.cache_quality import labelled_pairs, match_quality
from ember.gateway.config import CacheConfig, config_from_dict, hash_key
from tests.gateway.backends import FakeBackend
from tests.gateway.harness import GatewayProcess, RedisServer, ThreadedApp, write_config
from tests.server.harness import parse_sse

QUESTION = "What is the capital of France, and why is it famous?"
DOCUMENT = "The annual report describes revenue growth across all regions, new product launches and risks. " * 20


def cached_gateway(backend: FakeBackend, tmp_path) -> ThreadedApp:
    config = {
        "backends": [{"name": "a", "url": backend.url}],
        "models": [{"name": "m", "backends": ["a"]}],
        "keys": [
            {"name": "alice", "key_sha256": hash_key("sk-alice"), "tenant": "tenant-a"},
            {"name": "alice-2", "key_sha256": hash_key("sk-alice-2"), "tenant": "tenant-a"},
            {"name": "bob", "key_sha256": hash_key("sk-bob"), "tenant": "tenant-b"},
        ],
        "cache": {"enabled": True},
        "store": {"path": str(tmp_path / "gw.sqlite3")},
    }
    return ThreadedApp(build_app(config_from_dict(config)))


def ask(gateway, key: str, content: str = QUESTION, headers: dict | None = None, **extra) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 16, "temperature": 0, **extra}
    return httpx.post(
        gateway.base_url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}", **(headers or {})}, timeout=120
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
    assert (near.headers["x-ember-cache"], near.headers["x-ember-cache-match"]) == ("hit", "canonical")
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
    config = CacheConfig(enabled=True, ttl_s=10)
    cache = SemanticCache(config, LocalEntries(config, clock=lambda: now[0]))

    async def lookups_at(*times: float) -> list:
        await cache.store("scope", "prompt", {"answer": 1})
        found = [await cache.lookup("other scope", "prompt")]
        for time_s in times:
            now[0] = time_s
            answer = await cache.lookup("scope", "prompt")
            found.append(answer and answer.response)
        return found

    assert asyncio.run(lookups_at(9.9, 10.0)) == [None, {"answer": 1}, None]


def test_no_labelled_different_question_pair_hits_and_recall_is_measured():
    quality = match_quality(labelled_pairs())
    assert quality.same_pairs + quality.different_pairs >= 100 and quality.different_pairs >= 50
    assert quality.false_hits == []
    assert quality.recall >= 0.8, [pair.why for pair in quality.missed]


@pytest.mark.parametrize(("first", "second"), [
    ("What is 12 plus 7?", "What is 12 plus 8?"),
    ("When did World War I end?", "When did World War II end?"),
    ("Convert 100 degrees Fahrenheit to Celsius.", "Convert 100 degrees Celsius to Fahrenheit."),
    (DOCUMENT + "What was the revenue growth?", DOCUMENT + "What are the main risks?"),
])  # fmt: skip
def test_the_issues_four_different_questions_miss_through_a_gateway(tmp_path, first, second):
    with FakeBackend("a") as backend, cached_gateway(backend, tmp_path) as gateway:
        ask(gateway, "sk-alice", content=first)
        again = ask(gateway, "sk-alice", content=first.lower().rstrip("?."))
        other = ask(gateway, "sk-alice", content=second)
    assert again.headers["x-ember-cache-match"] == "canonical"
    assert "x-ember-cache" not in other.headers
    assert backend.record.requests == 2


def test_a_stream_cut_by_max_tokens_replays_as_length(tmp_path):
    with FakeBackend("a") as backend, cached_gateway(backend, tmp_path) as gateway:
        streamed = ask(gateway, "sk-alice", stream=True, max_tokens=3)
        replay = ask(gateway, "sk-alice", stream=True, max_tokens=3)
        plain = ask(gateway, "sk-alice", max_tokens=3)
    finishes = [[e["choices"][0]["finish_reason"] for e in parse_sse(r.text)[:-1] if e["choices"]][-1] for r in (streamed, replay)]
    assert replay.headers["x-ember-cache"] == "hit" and finishes == ["length", "length"]
    assert plain.headers["x-ember-cache"] == "hit" and plain.json()["choices"][0]["finish_reason"] == "length"
    assert backend.record.requests == 1


def test_health_answers_within_100_ms_while_a_2_mib_prompt_is_looked_up_in_a_full_scope(tmp_path):
    """The gateway runs as its own process, so only its event loop is measured; the 2 MiB prompt
    is looked up twice (a miss that reaches the backend, then a canonical hit) in a scope filled
    to `max_entries_per_scope`."""
    big = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit 123. " * 40000)[: 2 * 1024 * 1024]
    with FakeBackend("a") as backend:
        config = {
            "backends": [{"name": "a", "url": backend.url}], "models": [{"name": "m", "backends": ["a"]}],
            "cache": {"enabled": True, "max_entries_per_scope": 64}, "store": {"path": str(tmp_path / "gw.sqlite3")},
        }  # fmt: skip
        with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gateway:
            for number in range(32):  # 32 answers, each under 2 keys: the scope is full
                ask(gateway, "none", content=f"question number {number}")
            assert ask(gateway, "none", content=big).status_code == 200
            latencies_s, replay = health_latencies_during(gateway.base_url, lambda: ask(gateway, "none", content=big.lower()))
    assert replay.headers["x-ember-cache-match"] == "canonical"
    assert len(latencies_s) >= 3 and max(latencies_s) < 0.1, latencies_s


def health_latencies_during(base_url: str, request) -> tuple[list[float], httpx.Response]:
    """GET /health back to back on another thread while `request()` runs; their latencies and its response."""
    latencies_s: list[float] = []
    is_done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=base_url, timeout=10) as client:
            while not is_done.is_set():
                started = time.perf_counter()
                client.get("/health").raise_for_status()
                latencies_s.append(time.perf_counter() - started)
                time.sleep(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        time.sleep(0.05)
        response = request()
    finally:
        is_done.set()
        poller.join()
    return latencies_s, response


def test_replicas_on_one_redis_share_entries_within_a_tenant(tmp_path):
    with RedisServer(tmp_path) as redis_server, FakeBackend("a") as backend:
        config = {
            "backends": [{"name": "a", "url": backend.url}], "models": [{"name": "m", "backends": ["a"]}],
            "keys": [{"name": "alice", "key_sha256": hash_key("sk-alice"), "tenant": "tenant-a"},
                     {"name": "bob", "key_sha256": hash_key("sk-bob"), "tenant": "tenant-b"}],
            "cache": {"enabled": True, "max_entries_per_scope": 4},
            "store": {"kind": "redis", "url": redis_server.url, "namespace": "shared-cache"},
        }  # fmt: skip
        with ThreadedApp(build_app(config_from_dict(config))) as first, ThreadedApp(build_app(config_from_dict(config))) as second:
            asked = ask(first, "sk-alice")
            shared = ask(second, "sk-alice", content=QUESTION.lower())
            other_tenant = ask(second, "sk-bob")
            for number in range(3):  # 3 more answers x 2 keys: the first answer is pushed out of its scope
                ask(first, "sk-alice", content=f"filler question {number}")
            evicted = ask(second, "sk-alice")
    assert shared.headers["x-ember-cache-match"] == "canonical" and shared.json() == asked.json()
    assert "x-ember-cache" not in other_tenant.headers and "x-ember-cache" not in evicted.headers
    assert backend.record.requests == 1 + 1 + 3 + 1
