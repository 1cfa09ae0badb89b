"""A real `ember serve` process (tiny random Llama, SmolLM2 tokenizer) under a burst.

Given a server with `--max-waiting 4 --max-num-seqs 16`, when 256 requests arrive at once, then at
most 4 + 16 are admitted (none runs yet), every other one gets 503 with Retry-After, and every
admitted one finishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.harness import ServeProcess, assert_openai_error, tiny_server_process

MAX_WAITING = 4
MAX_NUM_SEQS = 16
BURST = 256


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, smollm2_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    log_path = tmp_path_factory.mktemp("pressure-serve") / "serve.log"
    settings = ("--max-waiting", str(MAX_WAITING), "--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", "256")
    with tiny_server_process(tiny_model_dir, smollm2_tokenizer_dir, log_path, *settings) as process:
        yield process


async def _burst(base_url: str, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        # Every connection open before any request is sent, so the requests arrive as one burst.
        await asyncio.gather(*(client.get("/health") for _ in range(count)))
        body = {"prompt": "Tell me a story", "max_tokens": 8, "ignore_eos": True}
        return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(count)))


def test_a_burst_of_256_meets_the_waiting_room(server: ServeProcess) -> None:
    responses = asyncio.run(_burst(server.base_url, BURST))
    admitted = [response for response in responses if response.status_code == 200]
    refused = [response for response in responses if response.status_code != 200]
    assert 1 <= len(admitted) <= MAX_WAITING + MAX_NUM_SEQS, len(admitted)
    for response in refused:
        error = assert_openai_error(response, 503)
        assert error["code"] == "server_overloaded"
        assert int(response.headers["retry-after"]) >= 1
    for response in admitted:
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "length"
        assert response.json()["usage"]["completion_tokens"] == 8
    debug = httpx.get(f"{server.base_url}/debug/engine").json()
    assert (debug["server_num_waiting"], debug["server_num_in_flight"]) == (0, 0)
