"""A radix-cache hit that ends inside a block, against transformers (the reference), LOGIT_TOLERANCE.

The second prompt leaves the first two tokens into a 4-token block: the radix cache serves it up to
there (the partial block copied into the request's own) and the request computes only the rest.
What it predicts must still be transformers' numbers, for plain attention, alternating sliding-window
and global layers (gemma2: two layer groups), and MLA latents (deepseek_v2).
"""

from __future__ import annotations

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from tests.model_factory import load_reference, save_tiny_model
from tests.models.family_parity import single_thread_torch  # noqa: F401 (a fixture)
from tests.models.test_prefix_cache_parity import (
    assert_position_matches,
    reference_log_softmax,
    run,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

BLOCK_SIZE = 4
NUM_GENERATED = 6


@pytest.mark.parametrize("family", ["llama", "gemma2", "deepseek_v2"])
def test_a_hit_ending_inside_a_block_predicts_what_transformers_predicts(family, tmp_path):
    folder = save_tiny_model(family, tmp_path / family)
    generator = torch.Generator().manual_seed(7)
    first = torch.randint(3, 300, (19,), generator=generator).tolist()
    second = first[:18] + torch.randint(3, 300, (5,), generator=generator).tolist()
    engine = LLMEngine(EngineConfig(model=str(folder), cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=64, prefix_cache="radix")))
    run(engine, "first", first, SamplingParams(max_tokens=1))
    params = SamplingParams(temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True, logprobs=MAX_LOGPROBS)
    output = run(engine, "second", second, params)
    assert output.num_cached_tokens == 18
    completion = output.outputs[0]
    expected = reference_log_softmax(load_reference(folder), second + completion.token_ids)
    for step, (token_id, position) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        row = expected[len(second) - 1 + step]
        assert token_id == int(row.argmax()), f"generated token {step} is not transformers' greedy choice"
        assert_position_matches(position, row, f"generated token {step}")
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
