"""Virtual keys, allow lists, budgets and token accounting on one gateway with the SQLite store."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict, hash_key
from ember.gateway.sqlite_store import SQLiteStore
from ember.gateway.store import window_of
from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import ThreadedApp
from tests.server.harness import assert_openai_error, parse_sse

ADMIN = "sk-admin"


def keyed_config(backend: FakeBackend, tmp_path, keys: list[dict]) -> dict:
    return {
        "backends": [{"name": "a", "url": backend.url, "continuous_usage": True, "first_token_timeout_s": 2}],
        "models": [
            {"name": "m", "backends": ["a"], "price": {"input_per_million": 1.0, "output_per_million": 2.0}},
            {"name": "other", "backends": ["a"]},
        ],
        "keys": keys,
        "admin_key_sha256": hash_key(ADMIN),
        "store": {"path": str(tmp_path / "gw.sqlite3")},
    }


def chat(gateway: ThreadedApp, key: str | None, model: str = "m", **extra) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8, **extra}
    return httpx.post(gateway.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def ledger(tmp_path, key: str):
    store = SQLiteStore(str(tmp_path / "gw.sqlite3"))
    try:
        return asyncio.run(store.ledger(hash_key(key))), asyncio.run(store.totals(hash_key(key)))
    finally:
        asyncio.run(store.close())


def test_wrong_missing_and_revoked_keys_get_401_and_allow_lists_403(tmp_path):
    keys = [{"name": "a", "key_sha256": hash_key("sk-a"), "models": ["m"]}]
    with FakeBackend("a") as backend, ThreadedApp(build_app(config_from_dict(keyed_config(backend, tmp_path, keys)))) as gateway:
        assert chat(gateway, "sk-a").status_code == 200
        assert assert_openai_error(chat(gateway, None), 401)["code"] == "invalid_api_key"
        assert assert_openai_error(chat(gateway, "sk-wrong"), 401)["code"] == "invalid_api_key"
        assert assert_openai_error(chat(gateway, "sk-a", model="other"), 403)["code"] == "model_not_allowed"
        models = httpx.get(gateway.base_url + "/v1/models", headers={"authorization": "Bearer sk-a"}).json()
        assert [card["id"] for card in models["data"]] == ["m"]
        revoke = {"key_sha256": hash_key("sk-a")}
        assert_openai_error(httpx.post(gateway.base_url + "/admin/keys/revoke", json=revoke, headers={"authorization": "Bearer sk-a"}), 401)
        assert httpx.post(gateway.base_url + "/admin/keys/revoke", json=revoke, headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert assert_openai_error(chat(gateway, "sk-a"), 401)["code"] == "invalid_api_key"
    assert backend.record.requests == 1


def test_budget_admits_only_what_it_can_pay_for_and_the_ledger_matches_the_clients(tmp_path):
    # A request's bound: prompt 13 bytes + 16 x 2 template tokens = 45 input, 8 output tokens,
    # 45 x 1000 + 8 x 2000 = 61000 nano-USD. Each really costs 3 x 1000 + 5 x 2000 = 13000.
    keys = [{"name": "a", "key_sha256": hash_key("sk-a"), "budget_usd": 0.0001}]  # 100000 nano-USD
    with FakeBackend("a") as backend, ThreadedApp(build_app(config_from_dict(keyed_config(backend, tmp_path, keys)))) as gateway:
        responses = [chat(gateway, "sk-a") for _ in range(8)]
        metrics = httpx.get(gateway.base_url + "/metrics").text
    statuses = [response.status_code for response in responses]
    # 100000 - 61000 allows the first; after each settles at 13000 the bound fits again until
    # committed spend + 61000 > 100000: 13000 x 3 + 61000 = 100000 fits, 13000 x 4 + 61000 does not.
    assert statuses == [200, 200, 200, 200, 429, 429, 429, 429]
    error = assert_openai_error(responses[-1], 429)
    assert error["code"] == "budget_exceeded" and "no retry will succeed" in error["message"]
    assert "retry-after" not in responses[-1].headers  # nothing in flight: the spend itself leaves no room
    rows, totals = ledger(tmp_path, "sk-a")
    assert [(row.prompt_tokens, row.completion_tokens, row.cost_nano_usd) for row in rows] == [(3, 5, 13000)] * 4
    client_usage = [(r.json()["usage"]["prompt_tokens"], r.json()["usage"]["completion_tokens"]) for r in responses[:4]]
    assert client_usage == [(3, 5)] * 4
    assert (totals.spent_nano_usd, totals.committed_nano_usd, totals.requests) == (52000, 52000, 4)
    assert 'ember_gateway_spend_nano_usd_total{key="a",model="m"} 52000.0' in metrics
    assert 'ember_gateway_tokens_total{key="a",kind="completion",model="m"} 20.0' in metrics
    assert 'ember_gateway_rejections_total{code="budget_exceeded",key="a"} 4.0' in metrics


def test_a_stream_cut_by_the_client_is_billed_for_what_it_received(tmp_path):
    keys = [{"name": "a", "key_sha256": hash_key("sk-a")}]
    behaviour = Behaviour("stall_mid_stream", tokens_before_stall=4)
    with FakeBackend("a", behaviour) as backend, ThreadedApp(build_app(config_from_dict(keyed_config(backend, tmp_path, keys)))) as gateway:
        body = {"model": "m", "messages": [{"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7"}], "max_tokens": 9, "stream": True}
        received = []
        with httpx.stream("POST", gateway.base_url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-a"}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    received.extend(parse_sse(line))
                    if len([e for e in received if e["choices"] and e["choices"][0]["delta"].get("content")]) == 4:
                        break  # the backend now stalls; the client gives up
        rows = []
        deadline = time.monotonic() + 10
        while not rows and time.monotonic() < deadline:
            time.sleep(0.1)
            rows, totals = ledger(tmp_path, "sk-a")
    assert [(row.status, row.prompt_tokens, row.completion_tokens) for row in rows] == [("cancelled", 7, 4)]
    assert totals.spent_nano_usd == 7 * 1000 + 4 * 2000 == totals.committed_nano_usd
    assert all("usage" not in event for event in received)  # the client did not ask for usage


@pytest.mark.parametrize("limit", ["rpm", "tpm"])
def test_rate_limits_answer_429_with_retry_after(tmp_path, limit):
    # A request's bound is 53 tokens and it uses 8: 8 + 53 fits in 65, 16 + 53 does not.
    value = 2 if limit == "rpm" else 65
    keys = [{"name": "a", "key_sha256": hash_key("sk-a"), limit: value}]
    with FakeBackend("a") as backend, ThreadedApp(build_app(config_from_dict(keyed_config(backend, tmp_path, keys)))) as gateway:
        started = time.time()
        responses = [chat(gateway, "sk-a") for _ in range(3)]
    if window_of(started) != window_of(time.time()):
        pytest.skip("the requests straddled a one-minute rate window boundary; rerun")
    assert [response.status_code for response in responses][:2] == [200, 200]
    error = assert_openai_error(responses[2], 429)
    assert error["code"] == "rate_limit_exceeded" and int(responses[2].headers["retry-after"]) >= 1
