"""End to end on loopback: 2 real `ember serve` replicas, a backend that fails and one that
stalls, behind 2 gateway processes sharing a real Redis. One replica is killed (SIGKILL) and
restarted under load: no client request fails, except streams already started on it, which end
with an error event."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import httpx
import pytest

from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import (
    EmberReplica,
    GatewayProcess,
    RedisServer,
    stories_serve_args,
    write_config,
)


@dataclasses.dataclass
class Outcomes:
    ok: int = 0
    cut_after_start: int = 0  # streams that had tokens, then an error event and [DONE]
    failed: list = dataclasses.field(default_factory=list)


async def one_request(client: httpx.AsyncClient, url: str, index: int, outcomes: Outcomes) -> None:
    is_stream = index % 2 == 0
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Once upon a time {index}"}], "max_tokens": 48, "stream": is_stream}
    try:
        if not is_stream:
            response = await client.post(url + "/v1/chat/completions", json=body)
            if response.status_code == 200 and response.json()["choices"][0]["finish_reason"]:
                outcomes.ok += 1
            else:
                outcomes.failed.append((index, response.status_code, response.text[:200]))
            return
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                outcomes.failed.append((index, response.status_code, (await response.aread())[:200]))
                return
            events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
        payloads = [json.loads(event) for event in events[:-1]]
        errors = [payload for payload in payloads if "error" in payload]
        has_tokens = any(p.get("choices") and p["choices"][0]["delta"].get("content") for p in payloads)
        if events[-1] == "[DONE]" and not errors and payloads[-1]["choices"][0]["finish_reason"]:
            outcomes.ok += 1
        elif events[-1] == "[DONE]" and len(errors) == 1 and has_tokens:
            outcomes.cut_after_start += 1
        else:
            outcomes.failed.append((index, "stream", events[-3:]))
    except httpx.HTTPError as error:
        outcomes.failed.append((index, type(error).__name__, str(error)))


async def load(urls: list[str], stop: threading.Event, outcomes: Outcomes, workers: int = 4) -> None:
    counter = iter(range(10**9))

    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            index = next(counter)
            await one_request(client, urls[index % len(urls)], index, outcomes)

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(workers)))


@pytest.mark.slow
def test_no_request_fails_while_a_replica_is_killed_and_restarted(tmp_path, stories_dir):
    with RedisServer(tmp_path) as redis_server, FakeBackend("bad", Behaviour("fail")) as bad, FakeBackend(
        "stuck", Behaviour("stall")
    ) as stuck, EmberReplica(stories_serve_args(stories_dir, tmp_path / "t0.jinja"), tmp_path / "r0.log") as r0, EmberReplica(
        stories_serve_args(stories_dir, tmp_path / "t1.jinja"), tmp_path / "r1.log"
    ) as r1:
        r0.wait_healthy()
        r1.wait_healthy()
        config = {
            "backends": [
                {"name": "r0", "url": r0.base_url + "/v1", "continuous_usage": True, "first_token_timeout_s": 5},
                {"name": "r1", "url": r1.base_url + "/v1", "continuous_usage": True, "first_token_timeout_s": 5},
                {"name": "bad", "url": bad.url},
                {"name": "stuck", "url": stuck.url, "first_token_timeout_s": 1, "timeout_s": 2},
            ],
            "models": [{"name": "tiny", "backends": ["r0", "bad", "stuck", "r1"]}],
            "retry": {"max_attempts": 5, "backoff_base_s": 0.02, "backoff_max_s": 0.2},
            "breaker": {"failure_threshold": 1, "cooldown_s": 2},
            "store": {"kind": "redis", "url": redis_server.url, "namespace": "replicas"},
        }
        path = write_config(tmp_path, config)
        with GatewayProcess(path, tmp_path / "g1.log") as g1, GatewayProcess(path, tmp_path / "g2.log") as g2:
            outcomes, stop = Outcomes(), threading.Event()
            runner = threading.Thread(target=lambda: asyncio.run(load([g1.base_url, g2.base_url], stop, outcomes)))
            runner.start()
            time.sleep(4)
            served_before_kill = outcomes.ok
            r0.kill()
            time.sleep(3)
            r0.start()
            r0.wait_healthy()
            time.sleep(5)
            stop.set()
            runner.join(timeout=120)
            r0_prompt_tokens_after_restart = r0.metric("ember:prompt_tokens_total")
            attempts = httpx.get(g1.base_url + "/metrics").text + httpx.get(g2.base_url + "/metrics").text
    assert outcomes.failed == []
    assert served_before_kill > 0 and outcomes.ok > served_before_kill
    assert r0_prompt_tokens_after_restart > 0  # the restarted replica was routed to again
    assert 'backend="bad",outcome="retryable_error"' in attempts and 'backend="stuck",outcome="retryable_error"' in attempts
    assert bad.record.requests >= 2 and stuck.record.requests >= 2
