"""Two gateway processes sharing a real Redis: budgets and rate limits hold exactly under 50
concurrent streams split between them, and a key revoked on one is refused by the other."""

from __future__ import annotations

import asyncio
import collections

import httpx
import pytest

from ember.gateway.config import hash_key
from ember.gateway.redis_store import RedisStore
from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import GatewayProcess, RedisServer, write_config
from tests.server.harness import parse_sse

NAMESPACE = "gw-test"
STREAMS = 50
# Each request: prompt "alpha beta gamma delta" (22 bytes + 16 x 2 template tokens = 54) and
# max_tokens 10: a bound of 64 tokens and 54 x 1000 + 10 x 2000 = 74000 nano-USD. It really
# uses 4 prompt + 6 completion tokens = 16000 nano-USD.
BUDGET_USD = 0.0005  # 500000 nano-USD: 6 bounds fit at once; 50 x 16000 do not fit at all
TPM = 500  # 7 bounds fit at once; 50 x 16 tokens do not fit at all


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replicas")
    with RedisServer(folder) as redis_server, FakeBackend("a", Behaviour(token_delay_s=0.05)) as backend:
        config = {
            "backends": [{"name": "a", "url": backend.url, "continuous_usage": True}],
            "models": [{"name": "m", "backends": ["a"], "price": {"input_per_million": 1.0, "output_per_million": 2.0}}],
            "keys": [
                {"name": "budgeted", "key_sha256": hash_key("sk-budget"), "budget_usd": BUDGET_USD},
                {"name": "limited", "key_sha256": hash_key("sk-tpm"), "tpm": TPM},
                {"name": "doomed", "key_sha256": hash_key("sk-doomed")},
            ],
            "admin_key_sha256": hash_key("sk-admin"),
            "store": {"kind": "redis", "url": redis_server.url, "namespace": NAMESPACE},
        }
        path = write_config(folder, config)
        with GatewayProcess(path, folder / "g1.log") as first, GatewayProcess(path, folder / "g2.log") as second:
            yield first, second, redis_server


async def stream_once(client: httpx.AsyncClient, base_url: str, key: str) -> tuple[int, dict | None]:
    body = {
        "model": "m", "messages": [{"role": "user", "content": "alpha beta gamma delta"}], "max_tokens": 10,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    response = await client.post(base_url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    if response.status_code != 200:
        return response.status_code, None
    events = parse_sse(response.text)
    return 200, next(event["usage"] for event in events if isinstance(event, dict) and event.get("usage"))


async def burst(gateways, key: str) -> list[tuple[int, dict | None]]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=2 * STREAMS)) as client:
        return await asyncio.gather(*(stream_once(client, gateways[i % 2].base_url, key) for i in range(STREAMS)))


def store_view(redis_url: str, key: str):
    async def read():
        store = RedisStore(redis_url, NAMESPACE)
        try:
            rows = await store.ledger(hash_key(key))
            windows = {row.window: await store.window_totals(hash_key(key), row.window) for row in rows}
            return rows, await store.totals(hash_key(key)), windows
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_budget_holds_exactly_under_50_concurrent_streams_across_two_gateways(two_gateways):
    first, second, redis_server = two_gateways
    results = asyncio.run(burst([first, second], "sk-budget"))
    admitted = [usage for status, usage in results if status == 200]
    assert {status for status, _ in results} == {200, 429}
    rows, totals, _ = store_view(redis_server.url, "sk-budget")
    # The ledger holds exactly the admitted requests, each billed what its client was told.
    assert sorted((row.prompt_tokens, row.completion_tokens) for row in rows) == sorted(
        (usage["prompt_tokens"], usage["completion_tokens"]) for usage in admitted
    )
    assert all(row.status == "ok" and row.cost_nano_usd == row.prompt_tokens * 1000 + row.completion_tokens * 2000 for row in rows)
    assert totals.spent_nano_usd == sum(row.cost_nano_usd for row in rows) == totals.committed_nano_usd
    assert totals.spent_nano_usd <= BUDGET_USD * 1e9
    assert totals.requests == len(rows) == len(admitted)


def test_a_token_rate_limit_holds_exactly_under_50_concurrent_streams_across_two_gateways(two_gateways):
    first, second, redis_server = two_gateways
    results = asyncio.run(burst([first, second], "sk-tpm"))
    assert collections.Counter(status for status, _ in results).keys() == {200, 429}
    rows, totals, windows = store_view(redis_server.url, "sk-tpm")
    assert len(rows) == sum(status == 200 for status, _ in results)
    for window, (_, window_tokens) in windows.items():
        used = sum(row.prompt_tokens + row.completion_tokens for row in rows if row.window == window)
        assert window_tokens == used <= TPM  # everything settled: the window holds the exact usage
    assert totals.prompt_tokens + totals.completion_tokens == sum(row.prompt_tokens + row.completion_tokens for row in rows)


def test_a_key_revoked_on_one_gateway_is_refused_by_the_other(two_gateways):
    first, second, _ = two_gateways
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"authorization": "Bearer sk-doomed"}
    assert httpx.post(second.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=10).status_code == 200
    revoke = httpx.post(
        first.base_url + "/admin/keys/revoke", json={"key_sha256": hash_key("sk-doomed")}, headers={"authorization": "Bearer sk-admin"}
    )
    assert revoke.status_code == 200
    refused = httpx.post(second.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
