"""PP=2 against the single-process engine: each stage runs whole layers, so the logits are the same
float32 numbers (tolerance 0); activations go stage to stage by point-to-point sends."""

from __future__ import annotations

import pytest

from ember.llm import LLM
from ember.parallel.config import ParallelConfig
from ember.parallel.shared_exchange import SHARED_FOLDER, exchange_library
from ember.parallel.worker import parameter_bytes
from tests.model_factory import save_tiny_model
from tests.parallel.moe_models import save_deepseek_v2, save_mixtral
from tests.parallel.tp_parity import assert_parallel_matches, assert_volume_matches_formula

PROMPTS = [[5, 9, 14, 200, 3, 77], list(range(30, 53)), [1], [100, 2, 8, 8, 8, 40, 41, 42, 43]]
OPTIONS = dict(block_size=4, num_kv_blocks=200, max_num_batched_tokens=64, enable_prefix_caching=False)


def test_pp2_qwen2_hybrid_windows_three_layers_match_single_process_exactly(tmp_path, single_thread_torch):
    """Layer 0 on rank 0 (its embedding and head weigh about a layer), layers 1-2 and the norm on rank 1; full and
    windowed groups."""
    folder = save_tiny_model(
        "qwen2", tmp_path / "qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=1
    )
    single = LLM(str(folder), **OPTIONS)
    parallel = LLM(str(folder), pipeline_parallel_size=2, **OPTIONS)
    try:
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=0.0)
        assert_volume_matches_formula(parallel, PROMPTS)
        memory = parallel.engine.workers.memory
        assert sum(memory.parameter_bytes) == parameter_bytes(single.engine.runner.model)
        assert parallel.engine.workers.held_layers == range(0, 1)
        # Layers 0 (full) and 1 (windowed) share cache tensor 0, layer 2 has tensor 1: rank 1 allocates both.
        assert memory.kv_cache_bytes == [single.engine.runner.kv_cache_bytes // 2, single.engine.runner.kv_cache_bytes]
    finally:
        parallel.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "mistral", "mixtral", "deepseek_v2"])
def test_pp2_families_match_single_process_exactly(tmp_path, single_thread_torch, family):
    if family == "mixtral":
        folder = save_mixtral(tmp_path / family)
    elif family == "deepseek_v2":
        folder = save_deepseek_v2(tmp_path / family)
    else:
        folder = save_tiny_model(family, tmp_path / family, **(dict(sliding_window=6) if family == "mistral" else {}))
    single = LLM(str(folder), **OPTIONS)
    parallel = LLM(str(folder), pipeline_parallel_size=2, **OPTIONS)
    try:
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=0.0)
    finally:
        parallel.shutdown()


def test_tp2_x_pp2_llama_matches_single_process(tmp_path, single_thread_torch):
    """Four ranks: two stages of two layers, each stage a tensor-parallel pair (its own gloo group); stage 0 holds
    the vocabulary-parallel embedding and head. Only the row layers' all-reduce reorders sums."""
    folder = save_tiny_model("llama", tmp_path / "llama", num_hidden_layers=4)
    single = LLM(str(folder), **OPTIONS)
    parallel = LLM(str(folder), tensor_parallel_size=2, pipeline_parallel_size=2, **OPTIONS)
    try:
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=1e-5)
        assert_volume_matches_formula(parallel, PROMPTS)  # rank 0: its stage's all-reduces and one row sent on
        if SHARED_FOLDER.is_dir() and exchange_library() is not None:  # one machine: each stage's sums through shared memory
            assert parallel.engine.runner.model.lm_head.communicator.exchange is not None
        memory = parallel.engine.workers.memory
        assert parallel.engine.workers.held_layers == range(0, 1)  # stage 0 also holds the embedding and head
        assert memory.kv_cache_bytes[0] == memory.kv_cache_bytes[1]  # a stage's ranks split its KV heads evenly
        assert memory.kv_cache_bytes[2] == 3 * memory.kv_cache_bytes[0]  # stage 1 holds layers 1-3
    finally:
        parallel.shutdown()


def test_pipeline_with_sequence_or_expert_parallel_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="plain tensor parallelism only"):
        ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2, enable_sequence_parallel=True)
