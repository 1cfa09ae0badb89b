"""TP=2 against the single-process engine on random checkpoints whose heads, inner size and
vocabulary do not divide by 2 (the SmolLM2 case: 3 KV heads), and the bytes each rank sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.llm import LLM
from ember.parallel.shared_exchange import SHARED_FOLDER, exchange_library
from ember.parallel.worker import parameter_bytes
from tests.model_factory import save_tiny_model
from tests.parallel.tp_parity import (
    assert_only_the_all_reduce_reorders,
    assert_parallel_matches,
    assert_volume_matches_formula,
)

# SmolLM2's logits reach |33| after 30 layers. Each row-parallel all-reduce adds two partial sums
# where one process keeps adding onto the first: one float32 rounding per element, 60 times per
# forward pass. Measured: 1.33e-4 max abs difference (4.3e-6 of the largest logit), and exactly
# 0 against a single process whose row layers add the same partial sums (split_sum_reference).
SMOLLM2_LOGIT_TOLERANCE = 2e-4

BLOCK_SIZE = 4
PROMPTS = [[5, 9, 14, 200, 3, 77], list(range(30, 53)), [1], [300, 2, 8, 8, 8, 40, 41, 42, 43]]
# 6 query heads over 3 KV heads, odd inner size and vocabulary: every split is uneven at TP=2.
UNEVEN_SHAPE = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, intermediate_size=129, vocab_size=321)


def engines(folder: Path, budget: int = 64) -> tuple[LLM, LLM]:
    options = dict(block_size=BLOCK_SIZE, num_kv_blocks=200, max_num_batched_tokens=budget, enable_prefix_caching=False)
    return LLM(str(folder), **options), LLM(str(folder), tensor_parallel_size=2, **options)


def test_tp2_qwen2_hybrid_windows_uneven_heads_match_single_process(tmp_path, single_thread_torch):
    """Qwen2 with q/k/v biases, windowed and full layers (hybrid), and uneven splits everywhere."""
    folder = save_tiny_model(
        "qwen2", tmp_path / "qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1, **UNEVEN_SHAPE
    )
    single, parallel = engines(folder)
    try:
        if SHARED_FOLDER.is_dir() and exchange_library() is not None:  # one machine: sums through shared memory
            assert parallel.engine.workers.communicator.exchange is not None
        assert_parallel_matches(single, parallel, PROMPTS)
        memory = parallel.engine.workers.memory
        whole = parameter_bytes(single.engine.runner.model)
        # Rank 0 holds 2 of 3 KV groups: 2/3 of attention; the rest splits evenly (norms are whole on both).
        assert max(memory.parameter_bytes) < 0.62 * whole
        assert sum(memory.parameter_bytes) < 1.02 * whole
        assert_volume_matches_formula(parallel, PROMPTS)
        # Inner slices of 65 and 64 (not a multiple of the SIMD width): torch's vectorized SiLU and
        # its scalar tail round a few elements differently than at 129; measured 3e-7, so not bit-exact here.
        assert_only_the_all_reduce_reorders(single, parallel, PROMPTS, tolerance=1e-6)
    finally:
        parallel.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "smollm3"])
@pytest.mark.parametrize("switch", ["all-reduce", "sequence-parallel", "exact-row-parallel"])
def test_tp2_llama_family_models_match_single_process(tmp_path, single_thread_torch, family, switch):
    overrides = dict(sliding_window=6) if family == "mistral" else {}
    folder = save_tiny_model(family, tmp_path / family, **overrides)
    options = dict(block_size=BLOCK_SIZE, num_kv_blocks=200, max_num_batched_tokens=64, enable_prefix_caching=False)
    flags = {"all-reduce": {}, "sequence-parallel": {"enable_sequence_parallel": True}, "exact-row-parallel": {"exact_row_parallel": True}}
    single = LLM(str(folder), **options)
    parallel = LLM(str(folder), tensor_parallel_size=2, **flags[switch], **options)
    try:
        # Exact row layers leave nothing reordered (the tiny inner size 128 splits into SIMD-wide slices).
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=0.0 if switch == "exact-row-parallel" else 1e-5)
    finally:
        parallel.shutdown()


@pytest.mark.slow
def test_tp2_smollm2_gguf_matches_single_process(smollm2_gguf, single_thread_torch):
    """SmolLM2-135M: 9 query heads over 3 KV heads split 6+3 / 2+1 at TP=2; Q4_1 rows read per rank."""
    prompts = [[1, 504, 3458, 314, 260, 1345, 28], [4093, 12, 2078, 30, 5, 77, 890, 16, 9, 10, 11]]
    # float32 on both sides: a rank dequantizes its slice of the Q4_1 weights.
    options = dict(dtype="float32", block_size=16, num_kv_blocks=64)
    single = LLM(str(smollm2_gguf), **options)
    parallel = LLM(str(smollm2_gguf), tensor_parallel_size=2, **options)
    try:
        assert_parallel_matches(single, parallel, prompts, SMOLLM2_LOGIT_TOLERANCE)
        whole = parameter_bytes(single.engine.runner.model)
        assert max(parallel.engine.workers.memory.parameter_bytes) < 0.6 * whole
        assert_only_the_all_reduce_reorders(single, parallel, prompts)
    finally:
        parallel.shutdown()


def test_tp2_sequence_parallel_adds_the_same_partial_sums_and_sends_the_same_bytes(tmp_path, single_thread_torch):
    """Reduce-scatter + all-gather around the norms: the numbers of TP's all-reduce, bit for bit.

    The inner size divides into slices of 64, so nothing but the row-parallel sums differs from
    one process (no SIMD tail, see above); an odd flat batch (39 tokens) exercises the padding.
    """
    folder = save_tiny_model("qwen2", tmp_path / "qwen2", **{**UNEVEN_SHAPE, "intermediate_size": 128})
    options = dict(block_size=BLOCK_SIZE, num_kv_blocks=200, max_num_batched_tokens=64, enable_prefix_caching=False)
    single = LLM(str(folder), **options)
    parallel = LLM(str(folder), tensor_parallel_size=2, enable_sequence_parallel=True, **options)
    try:
        assert_parallel_matches(single, parallel, PROMPTS)
        assert_volume_matches_formula(parallel, [*PROMPTS, [7]])  # 40 tokens: no padding
        assert_volume_matches_formula(parallel, PROMPTS)  # 39 tokens: the formula's 40 padded ones
        assert_only_the_all_reduce_reorders(single, parallel, PROMPTS, tolerance=1e-6)  # token-split norms meet SIMD tails differently: ulps, not order
    finally:
        parallel.shutdown()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_tp2_exact_row_parallel_is_bit_identical_to_one_process(tmp_path, single_thread_torch, kv_cache_dtype):
    """All-gathers instead of the all-reduce: every output summed whole, in one process's order.

    Uneven heads (2 + 1 KV groups), hidden 96 and vocabulary 321; the inner size divides into
    slices of 64 (an uneven inner slice rounds a few SiLU elements differently, see above).
    With an fp8 cache every rank rounds the same K/V the same way: still bit-identical.
    """
    folder = save_tiny_model("qwen2", tmp_path / "qwen2", **{**UNEVEN_SHAPE, "intermediate_size": 128})
    options = dict(block_size=BLOCK_SIZE, num_kv_blocks=200, max_num_batched_tokens=64, enable_prefix_caching=False,
                   kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    single = LLM(str(folder), **options)
    parallel = LLM(str(folder), tensor_parallel_size=2, exact_row_parallel=True, **options)
    try:
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=0.0)
        assert_volume_matches_formula(parallel, PROMPTS)
        # each rank's KV shard: K and V x 2 layers x 200 blocks x its KV heads (2 and 1 of 3), in the cache dtype
        element = 1 if kv_cache_dtype == "fp8" else 4
        per_head = 2 * 2 * 200 * BLOCK_SIZE * (96 // 6) * element
        assert parallel.engine.workers.memory.kv_cache_bytes == [2 * per_head, per_head]
    finally:
        parallel.shutdown()


@pytest.mark.slow
def test_tp2_smollm2_exact_row_parallel_is_bit_identical_to_one_process(smollm2_gguf, single_thread_torch):
    """The 1.33e-4 of the all-reduce gone: SmolLM2's logits are one process's, bit for bit."""
    prompts = [[1, 504, 3458, 314, 260, 1345, 28], [4093, 12, 2078, 30, 5, 77, 890, 16, 9, 10, 11]]
    options = dict(dtype="float32", block_size=16, num_kv_blocks=64)
    single = LLM(str(smollm2_gguf), **options)
    parallel = LLM(str(smollm2_gguf), tensor_parallel_size=2, exact_row_parallel=True, **options)
    try:
        assert_parallel_matches(single, parallel, prompts, tolerance=0.0)
        assert max(parallel.engine.workers.memory.parameter_bytes) < 0.6 * parameter_bytes(single.engine.runner.model)
    finally:
        parallel.shutdown()
