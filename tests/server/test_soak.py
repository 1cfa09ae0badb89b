"""Soak: ~300 mixed requests against a real `ember serve` whose KV pool forces preemption.

Given the tiny model served with a 40-block pool, when 300 chat and text completions (streamed
or whole, n up to 3, stop strings, seeds, logprobs, batched and token-id prompts) run 16 at a
time and about one in ten clients hangs up mid-answer, then: none is lost, none gets a 5xx or a
4xx, greedy answers do not change under load, the pool is whole again and memory stays bounded.
"""

from __future__ import annotations

import asyncio

import pytest

from ember.bench.soak import SoakSettings, run_soak, soak_requests, summary_rows
from tests.server.harness import ServeProcess

NUM_REQUESTS = 300
RSS_GROWTH_LIMIT_BYTES = 64 * 2**20


def test_the_soak_mix_has_what_it_claims() -> None:
    requests = soak_requests(SoakSettings(num_requests=NUM_REQUESTS, seed=1))
    bodies = [request.body for request in requests]
    assert sum(request.cancel_after_events is not None for request in requests) >= NUM_REQUESTS // 20
    assert any(body.get("n", 1) > 1 for body in bodies)
    assert any("stop" in body for body in bodies)
    assert any("seed" in body for body in bodies)
    assert any(body.get("stream") for body in bodies) and any(not body.get("stream") for body in bodies)
    assert any("messages" in body for body in bodies) and any("prompt" in body for body in bodies)


@pytest.mark.timeout(1200)  # about a minute on a quiet machine; a machine shared by many jobs can take ten times that
def test_soak_loses_nothing_and_leaves_the_pool_whole(tiny_server: ServeProcess) -> None:
    settings = SoakSettings(num_requests=NUM_REQUESTS, concurrency=16, cancel_fraction=0.1, max_tokens=8, seed=1)
    result = asyncio.run(run_soak(tiny_server.base_url, settings)).as_dict()
    print("\n".join(f"{measure}: {value}" for measure, value in summary_rows(result)))
    assert result["lost"] == 0, result["error_samples"]
    assert result["server_errors"] == 0, result["error_samples"]
    assert result["client_errors"] == 0, result["error_samples"]
    assert result["completed"] + result["cancelled"] == NUM_REQUESTS
    assert result["cancelled"] >= NUM_REQUESTS // 20
    assert result["preemptions"] > 0, "the pool never forced a preemption: the soak tested less than it claims"
    assert result["greedy_variants"] == 1
    assert result["requests_running_after"] == 0
    assert result["blocks_free_after"] == result["blocks_total"] > 0
    assert result["rss_after_bytes"] - result["rss_before_bytes"] < RSS_GROWTH_LIMIT_BYTES, result
