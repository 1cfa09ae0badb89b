"""Logits computed over a prefix-cached prompt against transformers (the reference), LOGIT_TOLERANCE.

A request whose prompt shares full blocks with an earlier one reads those blocks' KV from the
prefix cache and computes only the rest; what it predicts must still be transformers' numbers.
A request asking for prompt logprobs computes its whole prompt (a cached prefix holds no logits),
so every prompt position is there and matches too.
"""

from __future__ import annotations

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.outputs import OutputAccumulator, RequestOutput
from ember.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from tests.model_factory import load_reference, save_tiny_model
from tests.models.family_parity import LOGIT_TOLERANCE, single_thread_torch  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

BLOCK_SIZE = 4
SHARED_BLOCKS = 4
NUM_GENERATED = 6


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def prompts() -> dict[str, list[int]]:
    generator = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 320, (SHARED_BLOCKS * BLOCK_SIZE,), generator=generator).tolist()
    tails = {name: torch.randint(0, 320, (length,), generator=generator).tolist() for name, length in [("first", 3), ("second", 7), ("third", 5)]}
    return {name: shared + tail for name, tail in tails.items()}


def run(engine: LLMEngine, request_id: str, prompt: list[int], params: SamplingParams) -> RequestOutput:
    """Run one request alone to its end; its accumulated output."""
    engine.add_request(EngineRequest(request_id, prompt, params))
    accumulator = OutputAccumulator(request_id, params.n)
    while engine.has_unfinished_requests():
        for output in engine.step():
            accumulator.add(output)
    return accumulator.result()


def reference_log_softmax(reference, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(reference(torch.tensor([tokens])).logits[0].float(), dim=-1)


def assert_position_matches(position_logprobs, expected: torch.Tensor, where: str) -> None:
    """Every token ember reports at one position (chosen and top alternatives) has transformers' logprob."""
    for token_id, logprob in position_logprobs.items():
        difference = abs(logprob.logprob - float(expected[token_id]))
        assert difference <= LOGIT_TOLERANCE, f"{where}, token {token_id}: logprob differs by {difference}"
    most_likely = sorted(position_logprobs, key=lambda token_id: -position_logprobs[token_id].logprob)
    assert most_likely[:3] == expected.topk(3).indices.tolist(), where


def test_a_request_over_a_cached_prefix_predicts_what_transformers_predicts(model_folder, prompts):
    engine = LLMEngine(EngineConfig(model=str(model_folder), cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=64)))
    reference = load_reference(model_folder)
    run(engine, "first", prompts["first"], SamplingParams(max_tokens=1))
    hits_before = engine.stats().prefix_cache_hits
    params = SamplingParams(temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True, logprobs=MAX_LOGPROBS)
    output = run(engine, "second", prompts["second"], params)
    assert output.num_cached_tokens == SHARED_BLOCKS * BLOCK_SIZE
    assert engine.stats().prefix_cache_hits - hits_before == SHARED_BLOCKS * BLOCK_SIZE
    completion = output.outputs[0]
    expected = reference_log_softmax(reference, prompts["second"] + completion.token_ids)
    first_predicted = len(prompts["second"]) - 1
    for step, (token_id, position) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        row = expected[first_predicted + step]
        assert token_id == int(row.argmax()), f"generated token {step} is not transformers' greedy choice"
        assert_position_matches(position, row, f"generated token {step}")


def test_prompt_logprobs_after_a_cached_prefix_cover_every_position_and_match_transformers(model_folder, prompts):
    engine = LLMEngine(EngineConfig(model=str(model_folder), cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=64)))
    reference = load_reference(model_folder)
    run(engine, "first", prompts["first"], SamplingParams(max_tokens=1))
    output = run(engine, "third", prompts["third"], SamplingParams(max_tokens=1, prompt_logprobs=5))
    prompt = prompts["third"]
    assert output.num_cached_tokens == 0  # computed whole: a cached prefix holds no logits
    assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == len(prompt)
    assert output.prompt_logprobs[0] is None
    expected = reference_log_softmax(reference, prompt)
    for index, position in enumerate(output.prompt_logprobs[1:], start=1):
        assert prompt[index] in position, f"prompt position {index} reports another token"
        assert_position_matches(position, expected[index - 1], f"prompt position {index}")
    # Its blocks are cached for the next request all the same.
    later = run(engine, "again", prompts["third"], SamplingParams(max_tokens=1))
    assert later.num_cached_tokens == SHARED_BLOCKS * BLOCK_SIZE + BLOCK_SIZE
