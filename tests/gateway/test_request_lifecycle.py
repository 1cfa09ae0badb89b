"""Every request's aftermath: one log line per request, refusals included; the breaker gauge
reads 0 once the cooldown is over; a client leaving a non-streamed request aborts it upstream."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict, hash_key
from ember.gateway.sqlite_store import SQLiteStore
from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import ThreadedApp

CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two"}], "max_tokens": 4}


def config_for(backend: FakeBackend, tmp_path, **sections) -> dict:
    return {
        "backends": [{"name": "a", "url": backend.url}],
        "models": [{"name": "m", "backends": ["a"], "price": {"input_per_million": 1.0, "output_per_million": 2.0}}],
        "keys": [{"name": "k", "key_sha256": hash_key("sk-k"), "budget_usd": 0.00007}],  # 3 requests' worth (see below)
        "store": {"path": str(tmp_path / "gw.sqlite3")},
        **sections,
    }


def test_every_request_writes_one_log_line_refusals_included(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ember.gateway.requests")
    with FakeBackend("a") as backend, ThreadedApp(build_app(config_from_dict(config_for(backend, tmp_path)))) as gateway:
        post = lambda route, body, key="sk-k": httpx.post(gateway.base_url + route, json=body, headers={"authorization": f"Bearer {key}"})  # noqa: E731
        statuses = [
            post("/v1/chat/completions", CHAT).status_code,
            post("/v1/chat/completions", {**CHAT, "max_tokens": -1}).status_code,
            post("/v1/chat/completions", CHAT, key="sk-wrong").status_code,
            post("/v1/chat/completions", {**CHAT, "model": "nope"}).status_code,
            post("/v1/messages", {"model": "m", "messages": "Hi", "max_tokens": 4}).status_code,
            post("/v1/chat/completions", CHAT).status_code,
            post("/v1/chat/completions", CHAT).status_code,
            post("/v1/chat/completions", CHAT).status_code,  # bound 47000 nano-USD, spent 3 x 10000: past 70000
        ]
        metrics = httpx.get(gateway.base_url + "/metrics").text
    lines = [json.loads(record.getMessage()) for record in caplog.records if record.name == "ember.gateway.requests"]
    assert statuses == [200, 400, 401, 404, 400, 200, 200, 429]
    assert [(line["status"], line.get("http_status"), line.get("code")) for line in lines] == [
        ("ok", None, None), ("refused", 400, "invalid_value"), ("refused", 401, "invalid_api_key"),
        ("refused", 404, "model_not_found"), ("refused", 400, "invalid_value"), ("ok", None, None), ("ok", None, None),
        ("refused", 429, "budget_exceeded"),
    ]  # fmt: skip
    assert [line["key"] for line in lines] == ["k", "k", None, "k", "k", "k", "k", "k"]  # the key is checked before the body
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("ember_gateway_requests_total"))
    assert counted == len(lines) == len(statuses)


def test_the_breaker_gauge_reads_0_once_the_cooldown_is_over(tmp_path):
    sections = {"breaker": {"failure_threshold": 1, "cooldown_s": 0.5}, "retry": {"max_attempts": 1}}
    with FakeBackend("a", Behaviour("fail")) as backend, ThreadedApp(build_app(config_from_dict(config_for(backend, tmp_path, **sections)))) as gateway:

        def gauge() -> str:
            text = httpx.get(gateway.base_url + "/metrics").text
            return next(line for line in text.splitlines() if line.startswith("ember_gateway_backend_breaker_open"))

        failed = httpx.post(gateway.base_url + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-k"})
        while_open = gauge()
        time.sleep(0.6)
        after_cooldown = gauge()
    assert failed.status_code == 502
    assert while_open == 'ember_gateway_backend_breaker_open{backend="a"} 1.0'
    assert after_cooldown == 'ember_gateway_backend_breaker_open{backend="a"} 0.0'


@pytest.mark.parametrize("is_stream", [False, True])
def test_a_client_leaving_before_the_answer_aborts_the_request_upstream(tmp_path, is_stream):
    with FakeBackend("a", Behaviour("stall")) as backend, ThreadedApp(build_app(config_from_dict(config_for(backend, tmp_path)))) as gateway:
        with pytest.raises(httpx.ReadTimeout):
            body = {**CHAT, "stream": is_stream}
            httpx.post(gateway.base_url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-k"}, timeout=0.5)
        deadline = time.monotonic() + 5  # timeout_s is 60 and first_token_timeout_s 30: only an abort ends it sooner
        while backend.record.disconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        disconnects = backend.record.disconnects
    store = SQLiteStore(str(tmp_path / "gw.sqlite3"))
    try:
        rows, totals = asyncio.run(store.ledger(hash_key("sk-k"))), asyncio.run(store.totals(hash_key("sk-k")))
    finally:
        asyncio.run(store.close())
    assert disconnects == 1
    assert [(row.status, row.prompt_tokens, row.completion_tokens) for row in rows] == [("cancelled", 0, 0)]
    assert totals.committed_nano_usd == totals.spent_nano_usd == 0
