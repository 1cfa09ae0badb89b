"""EP=2 (`tensor_parallel_size=2, enable_expert_parallel=True`) against the single-process engine on tiny
random MoE checkpoints: each rank holds half the routed experts, everything else whole.

With top-2 routing a token's two expert outputs are added in the same order as in one process
(rank 0's experts come first in the sorted dispatch), and nothing else is split: the logits are
the same float32 numbers, so the tolerance is 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.layers.expert_parallel import ExpertParallelMoE
from ember.llm import LLM
from ember.parallel.worker import parameter_bytes
from tests.parallel.moe_models import save_deepseek_v2, save_mixtral, save_qwen2_moe, save_qwen3_moe
from tests.parallel.tp_parity import (
    assert_parallel_matches,
    assert_volume_matches_formula,
    prompt_logits,
)

PROMPTS = [[5, 9, 14, 200, 3, 77], list(range(30, 53)), [1], [100, 2, 8, 8, 8, 40, 41, 42, 43]]
OPTIONS = dict(block_size=4, num_kv_blocks=200, max_num_batched_tokens=64, enable_prefix_caching=False)


def _single_and_expert_parallel(folder: Path) -> tuple[LLM, LLM]:
    return LLM(str(folder), **OPTIONS), LLM(str(folder), tensor_parallel_size=2, enable_expert_parallel=True, **OPTIONS)


def test_ep2_mixtral_matches_single_process_exactly_with_half_the_experts_per_rank(tmp_path, single_thread_torch):
    single, parallel = _single_and_expert_parallel(save_mixtral(tmp_path / "mixtral"))
    try:
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=0.0)
        assert_volume_matches_formula(parallel, PROMPTS)
        whole = parameter_bytes(single.engine.runner.model)
        experts = sum(t.numel() * 4 for n, t in single.engine.runner.model.state_dict().items() if ".experts." in n)  # packed too
        assert parallel.engine.workers.memory.parameter_bytes == [whole - experts // 2] * 2
        _assert_every_routed_pair_counted_once(parallel)
    finally:
        parallel.shutdown()


def _assert_every_routed_pair_counted_once(parallel: LLM) -> None:
    """The load per rank (pairs run by each rank's experts) adds up to top-2 x tokens x MoE blocks."""
    blocks = [m for m in parallel.engine.runner.model.modules() if isinstance(m, ExpertParallelMoE)]
    for block in blocks:
        block.pairs_per_rank = [0, 0]
    prompt_logits(parallel, PROMPTS)
    loads = [sum(rank) for rank in zip(*(block.pairs_per_rank for block in blocks), strict=True)]
    assert sum(loads) == 2 * sum(len(p) for p in PROMPTS) * len(blocks) and min(loads) > 0


@pytest.mark.slow
@pytest.mark.parametrize("save", [save_qwen2_moe, save_qwen3_moe, save_deepseek_v2], ids=["qwen2-moe", "qwen3-moe", "deepseek-v2"])
def test_ep2_other_moe_families_match_single_process_exactly(tmp_path, single_thread_torch, save):
    single, parallel = _single_and_expert_parallel(save(tmp_path / "moe"))
    try:
        assert_parallel_matches(single, parallel, PROMPTS, tolerance=0.0)
        assert_volume_matches_formula(parallel, PROMPTS)
    finally:
        parallel.shutdown()


def test_expert_parallel_on_a_dense_model_names_the_fix(tmp_path):
    from tests.model_factory import save_tiny_model

    folder = save_tiny_model("llama", tmp_path / "llama")
    with pytest.raises(ValueError, match="drop the flag"):
        LLM(str(folder), tensor_parallel_size=2, enable_expert_parallel=True, **OPTIONS)
