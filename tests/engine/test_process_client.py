"""EngineProcessClient: the engine in its own process fails loudly, never silently.

A killed engine ends open streams and refuses new requests with EngineDeadError (the server
turns it into 503s); a model that cannot load raises in the caller; requests are validated on
the client's side with the engine's own limits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from ember.engine.client import EngineDeadError
from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.process_client import EngineProcessClient
from ember.engine.rejection import RequestRejected
from ember.engine.sampling_params import SamplingParams


def _config(stories_dir) -> EngineConfig:
    return EngineConfig(
        model=str(stories_dir / "stories260K.bin"),
        tokenizer=str(stories_dir / "tok512.bin"),
        cache=CacheConfig(block_size=4, num_kv_blocks=64),
        max_model_len=256,
    )


def test_a_killed_engine_ends_open_streams_and_refuses_new_requests(stories_dir):
    client = EngineProcessClient(_config(stories_dir), show_progress=False)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    prompt = client.tokenizer.encode("Once upon a time", add_special_tokens=True)

    async def stream_until_killed() -> tuple[int, BaseException | None]:
        received = 0
        try:
            async for _ in client.generate(EngineRequest("doomed", prompt, params)):
                received += 1
                if received == 3:
                    os.kill(client.pid, signal.SIGKILL)
        except EngineDeadError as error:
            return received, error
        return received, None

    started = time.monotonic()
    received, error = asyncio.run(asyncio.wait_for(stream_until_killed(), timeout=30))
    assert received >= 3 and isinstance(error, EngineDeadError)
    assert time.monotonic() - started < 30
    assert client.dead_reason is not None and "exit" in client.dead_reason

    async def new_request() -> None:
        async for _ in client.generate(EngineRequest("late", prompt, params)):
            pass

    with pytest.raises(EngineDeadError):
        asyncio.run(new_request())
    client.shutdown()


def test_a_model_that_cannot_load_raises_in_the_caller(tmp_path):
    with pytest.raises((FileNotFoundError, ValueError)) as caught:
        EngineProcessClient(EngineConfig(model=str(tmp_path / "missing.gguf")), show_progress=False)
    assert "missing.gguf" in str(caught.value)


def test_requests_are_validated_on_the_client_side_with_the_engines_limits(stories_dir):
    client = EngineProcessClient(_config(stories_dir), show_progress=False)
    try:
        with pytest.raises(RequestRejected) as too_long:
            client.generate(EngineRequest("long", [1] * 300, SamplingParams(max_tokens=1)))
        assert too_long.value.param == "prompt" and too_long.value.code == "context_length_exceeded"
        with pytest.raises(RequestRejected) as too_many:
            client.generate(EngineRequest("many", [1, 2], SamplingParams(max_tokens=255)))
        assert too_many.value.param == "max_tokens"
        assert client.limits.vocab_size == 512 and client.max_model_len == 256
    finally:
        client.shutdown()
    assert client.dead_reason == "the engine was shut down"


def test_an_engine_that_dies_while_idle_is_reported_without_a_request(stories_dir):
    client = EngineProcessClient(_config(stories_dir), show_progress=False)
    os.kill(client.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while client.dead_reason is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.dead_reason is not None and "exit code -9" in client.dead_reason
    client.shutdown()
    assert "exit code -9" in client.dead_reason  # the first reason stands


def test_one_client_serves_successive_event_loops_and_shuts_down_promptly(stories_dir):
    client = EngineProcessClient(_config(stories_dir), show_progress=False)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = client.tokenizer.encode("Once upon a time", add_special_tokens=True)

    async def tokens(request_id: str) -> list[int]:
        return [t async for delta in client.generate(EngineRequest(request_id, prompt, params)) for t in delta.outputs[0].token_ids]

    first, second = asyncio.run(tokens("a")), asyncio.run(tokens("b"))
    started = time.monotonic()
    client.shutdown()
    assert first == second and len(first) == 8
    assert time.monotonic() - started < 10


def test_a_step_message_larger_than_the_pipe_arrives_whole(stories_dir):
    client = EngineProcessClient(_config(stories_dir), show_progress=False)
    prompt = [1] + [(7 * i) % 500 + 3 for i in range(230)]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=20, logprobs=20)

    async def outputs():
        return [delta async for delta in client.generate(EngineRequest("big", prompt, params))]

    try:
        deltas = asyncio.run(asyncio.wait_for(outputs(), timeout=60))
    finally:
        client.shutdown()
    prompt_logprobs = next(d.prompt_logprobs for d in deltas if d.prompt_logprobs)
    assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    assert all(len(position) >= 20 for position in prompt_logprobs[1:])
    assert sum(len(d.outputs[0].token_ids) for d in deltas if d.outputs) == 2


def test_stats_and_step_records_are_current_when_a_request_starts_and_ends(stories_dir):
    """Stats and step records travel with the deltas: the server's waiting room reads the running count from them,
    and nothing is stale once the engine is idle."""
    client = EngineProcessClient(_config(stories_dir), show_progress=False)
    try:
        prompt = client.tokenizer.encode("Once upon a time", add_special_tokens=True)
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        seen_running: list[int] = []

        async def run() -> int:
            count = 0
            async for delta in client.generate(EngineRequest("r", prompt, params)):
                count += len(delta.outputs[0].token_ids)
                if count == 1:
                    seen_running.append(client.stats().num_running)
            return count

        assert asyncio.run(asyncio.wait_for(run(), timeout=60)) == 40
        stats = client.stats()
        assert seen_running == [1]
        assert (stats.num_running, stats.num_waiting, stats.generation_tokens_total) == (0, 0, 40)
        records = client.step_records()
        assert sum(record.num_scheduled_tokens for record in records) == len(prompt) + 39
        assert [record.step_index for record in records] == list(range(1, len(records) + 1))
    finally:
        client.shutdown()
