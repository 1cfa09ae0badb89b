"""No request moves a key's committed spend below zero or its spend past budget + one request's
bound: the stores refuse impossible reservations whatever the caller, and a gateway under
concurrent requests with negative and huge values mixed in holds the budget (SQLite and Redis)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from ember.gateway.app import build_app
from ember.gateway.config import KeyConfig, config_from_dict, hash_key
from ember.gateway.redis_store import RedisStore
from ember.gateway.sqlite_store import SQLiteStore
from ember.gateway.store import MAX_RESERVATION, InvalidReservation, LedgerRow
from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import RedisServer, ThreadedApp

KEY = KeyConfig(name="k", key_sha256=hash_key("sk-k"), tenant="t", budget_nano_usd=10**9)
# A request's bound: "Hi" is 2 bytes + 16 x 2 template tokens = 34 input tokens, and max_tokens 10:
# 34 x 1000 + 10 x 2000 = 54000 nano-USD. It really uses 1 prompt + 3 completion tokens.
BOUND_NANO_USD = 54_000
BUDGET_NANO_USD = 2 * BOUND_NANO_USD + 1_000  # two requests' bounds


@contextlib.contextmanager
def store_of(kind: str, folder):
    """A fresh store of `kind` (a real redis-server for redis); yields (store, its config section)."""
    if kind == "sqlite":
        yield SQLiteStore(str(folder / "gw.sqlite3")), {"path": str(folder / "gw.sqlite3")}
        return
    with RedisServer(folder) as server:
        yield RedisStore(server.url, "safety"), {"kind": "redis", "url": server.url, "namespace": "safety"}


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_store_refuses_an_impossible_reservation_and_changes_nothing(kind, tmp_path):
    bad_amounts = [(-1, 10), (0, 10), (10, -1_000_000_000), (1.5, 10), (10, float("inf")), (10, float("nan")),
                   (True, 10), ("7", 10), (MAX_RESERVATION + 1, 10), (10, 10**30)]  # fmt: skip

    async def scenario(store):
        for tokens, cost in bad_amounts:
            with pytest.raises(InvalidReservation):
                await store.reserve(KEY, "r", tokens, cost, 0.0)
        totals, window = await store.totals(KEY.key_sha256), await store.window_totals(KEY.key_sha256, 0)
        accepted = await store.reserve(KEY, "ok", 5, 0, 0.0)  # a free model's request costs nothing
        await store.close()
        return totals, window, accepted

    with store_of(kind, tmp_path) as (store, _):
        totals, window, accepted = asyncio.run(scenario(store))
    assert (totals.committed_nano_usd, totals.spent_nano_usd, window) == (0, 0, (0, 0))
    assert (accepted.tokens, accepted.cost_nano_usd) == (5, 0)


HOSTILE = [{"max_tokens": -1_000_000_000}, {"max_tokens": 10**30}, {"n": -3}, {"max_completion_tokens": -5},
           {"max_tokens": 0}, {"max_tokens": 1e300}, {"n": 0}, {"max_tokens": "12"}, {"max_tokens": 2**31 - 1, "n": 128}]  # fmt: skip


async def totals_then_close(store):
    try:
        return await store.totals(hash_key("sk-k"))
    finally:
        await store.close()


async def mixed_burst(base_urls: list[str]) -> list[int]:
    """40 concurrent chat requests: every fourth a normal one, the rest negative, zero, huge,
    fractional or non-numeric caps and choice counts; the last of HOSTILE is valid but its bound
    (2**31 - 1 tokens x 128 choices) is far past any budget."""
    bodies = []
    for index in range(40):
        extra = {"max_tokens": 10} if index % 4 == 0 else HOSTILE[index % len(HOSTILE)]
        bodies.append({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **extra})
    async with httpx.AsyncClient(timeout=60, headers={"authorization": "Bearer sk-k"}) as client:
        posts = (client.post(base_urls[index // 4 % len(base_urls)] + "/v1/chat/completions", json=body) for index, body in enumerate(bodies))
        responses = await asyncio.gather(*posts)
    return [response.status_code for response in responses]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_hostile_values_under_concurrency_never_move_spend_below_zero_or_past_budget(kind, tmp_path):
    with FakeBackend("a", Behaviour(token_delay_s=0.05)) as backend, store_of(kind, tmp_path) as (store, store_config):
        config = {
            "backends": [{"name": "a", "url": backend.url}],
            "models": [{"name": "m", "backends": ["a"], "price": {"input_per_million": 1.0, "output_per_million": 2.0}}],
            "keys": [{"name": "k", "key_sha256": hash_key("sk-k"), "budget_usd": BUDGET_NANO_USD / 1e9}],
            "store": store_config,
        }
        # Redis is the store of replicas: two gateways share it, the burst alternating between them.
        with contextlib.ExitStack() as stack:
            gateways = [stack.enter_context(ThreadedApp(build_app(config_from_dict(config)))) for _ in range(2 if kind == "redis" else 1)]
            statuses = asyncio.run(mixed_burst([gateway.base_url for gateway in gateways]))
        totals = asyncio.run(totals_then_close(store))
    normal = statuses[::4]
    hostile = {index % len(HOSTILE): status for index, status in enumerate(statuses) if index % 4}
    assert hostile == {**dict.fromkeys(range(len(HOSTILE) - 1), 400), len(HOSTILE) - 1: 429}, statuses
    assert set(normal) <= {200, 429} and 200 in normal, statuses
    assert 0 <= totals.committed_nano_usd == totals.spent_nano_usd <= BUDGET_NANO_USD + BOUND_NANO_USD
    assert totals.spent_nano_usd == normal.count(200) * (1 * 1000 + 3 * 2000)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_budget_held_in_flight_says_retry_after_and_a_spent_one_says_no_retry(kind, tmp_path):
    key = KeyConfig(name="k", key_sha256=hash_key("sk-k"), tenant="t", budget_nano_usd=100)

    async def scenario(store):
        held = await store.reserve(key, "first", 10, 60, 0.0)
        while_held = await store.reserve(key, "second", 10, 60, 0.0)
        await store.settle(held, LedgerRow("first", key.key_sha256, "m", held.window, 5, 5, 50, "ok"))
        after_spending = await store.reserve(key, "third", 10, 60, 0.0)
        await store.close()
        return while_held, after_spending

    with store_of(kind, tmp_path) as (store, _):
        while_held, after_spending = asyncio.run(scenario(store))
    assert (while_held.code, while_held.retry_after_s) == ("budget_exceeded", 1)
    assert (after_spending.code, after_spending.retry_after_s) == ("budget_exceeded", None)
    assert "no retry will succeed" in after_spending.message
