"""Both EngineClients (AsyncEngine on a thread, EngineProcessClient in its own process):
concurrent callers share steps; leaving a stream early aborts and frees its blocks."""

from __future__ import annotations

import asyncio

import pytest

from ember.engine.async_engine import AsyncEngine
from ember.engine.client import EngineClient
from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.process_client import EngineProcessClient
from ember.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module", params=["thread", "process"])
def engine(request, stories_dir):
    config = EngineConfig(
        model=str(stories_dir / "stories260K.bin"),
        tokenizer=str(stories_dir / "tok512.bin"),
        cache=CacheConfig(block_size=4, num_kv_blocks=128),
    )
    kind = AsyncEngine if request.param == "thread" else EngineProcessClient
    engine = kind(config, show_progress=False)
    assert isinstance(engine, EngineClient)
    yield engine
    engine.shutdown()


async def _collect(engine: EngineClient, request_id: str, prompt: list[int], params: SamplingParams) -> list[int]:
    tokens: list[int] = []
    async for delta in engine.generate(EngineRequest(request_id, prompt, params)):
        tokens.extend(delta.outputs[0].token_ids if delta.outputs else [])
    return tokens


def test_concurrent_requests_run_in_shared_steps_and_match_their_solo_outputs(engine):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [engine.tokenizer.encode(f"Once upon a time there was a {w}", add_special_tokens=True) for w in ("cat", "dog", "frog", "bee")]

    async def main():
        solo = [await _collect(engine, f"solo{i}", p, params) for i, p in enumerate(prompts)]
        together = await asyncio.gather(*(_collect(engine, f"pair{i}", p, params) for i, p in enumerate(prompts)))
        return solo, together

    solo, together = asyncio.run(main())
    assert together == solo
    shared_steps = [r for r in engine.step_records() if sum(rid.startswith("pair") for rid in r.request_ids) > 1]
    assert shared_steps


def test_leaving_a_stream_early_aborts_the_request_and_frees_its_blocks(engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    prompt = engine.tokenizer.encode("Once upon a time", add_special_tokens=True)

    async def main():
        stream = engine.generate(EngineRequest("early", prompt, params))
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(100):
            await asyncio.sleep(0.05)
            stats = engine.stats()
            if stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks:
                return stats
        return engine.stats()

    stats = asyncio.run(main())
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_total_blocks


def test_a_request_that_cannot_fit_is_refused_before_streaming(engine):
    async def main():
        async for _ in engine.generate(EngineRequest("big", [1] * 600, SamplingParams())):
            pass

    with pytest.raises(ValueError, match="context window"):
        asyncio.run(main())
