"""Tensor parallelism over quantized weights: each rank holds its slice in the checkpoint's own blocks and runs the
quantized kernels of one process on it.

The reference is ember's single-process engine at the same `--dtype auto`. With `--exact-row-parallel` every output
is summed whole on one rank, so logits are one process's bit for bit (a GGML head's exact-top refinement aside, see
the SmolLM2 test). With the all-reduce, the row layers add two partial sums where one process keeps adding: the
reference is then one process whose row layers add the same quantized partial sums (split_sum_reference), bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.bench.parallel import markdown, run_parallel_bench
from ember.llm import LLM
from ember.parallel.config import ParallelConfig
from ember.parallel.worker import parameter_bytes
from ember.quant.codes.float_codes import quantize_nf4
from ember.quant.codes.grid import BlockGrid
from ember.quant.ggml.blocks import GGMLTensor
from ember.quant.ggml.layers import GGMLLinear, ZeroPointLinear
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.int8.channel import quantize_weight
from ember.quant.parts import UnsplittableWeightError, quantized_part
from tests.model_factory import save_tiny_model
from tests.parallel.tp_parity import (
    assert_only_the_all_reduce_reorders,
    greedy_tokens,
    prompt_logits,
)
from tests.quant.gptq_awq_factory import Variant, write_checkpoint

PROMPTS = [[5, 9, 14, 200, 3, 77], list(range(30, 53)), [1], [300, 2, 8, 8, 8, 40, 41, 42, 43]]
SMOLLM2_PROMPTS = [[1, 504, 3458, 314, 260, 1345, 28], [4093, 12, 2078, 30, 5, 77, 890, 16, 9, 10, 11]]
OPTIONS = dict(block_size=4, num_kv_blocks=200, max_num_batched_tokens=64, enable_prefix_caching=False)


def _weight(rows: int = 16, cols: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


# -- parts of one weight ----------------------------------------------------------------------------------------------


def test_a_block_weights_rows_and_whole_block_columns_are_the_dense_weights_slices():
    weight = BlockGrid(bits=4, group_size=32).round_to_blocks(_weight())  # Q4_1
    dense = weight.dequantize()
    rows = quantized_part(weight, 0, 3, 11, "w")
    columns = quantized_part(weight, 1, 32, 96, "w")
    assert isinstance(rows, GGMLTensor) and isinstance(columns, GGMLTensor)
    assert torch.equal(rows.dequantize(), dense[3:11])
    assert torch.equal(columns.dequantize(), dense[:, 32:96])
    assert columns.nbytes == weight.nbytes // 2  # the rank holds half the blocks, nothing else


def test_a_column_split_inside_a_block_is_refused_naming_the_weight_and_its_blocks():
    weight = quantize_nf4(_weight())  # 64-value blocks
    with pytest.raises(UnsplittableWeightError, match=r"o_proj.weight \[16, 128\] in NF4 blocks of 64 values .* \[32, 128\)"):
        quantized_part(weight, 1, 32, 128, "o_proj.weight")


def test_a_zero_point_weight_split_inside_a_group_keeps_each_sides_offsets():
    blocks = BlockGrid(bits=4, group_size=32, symmetric=True).round_to_blocks(_weight())
    offsets = _weight(16, 2, seed=1)  # two groups of 64 columns: the split at 32 cuts the first one
    weight = ZeroPointTensor(blocks, offsets, torch.arange(128) // 64, None)
    for start, stop in ((0, 32), (32, 128)):
        part = quantized_part(weight, 1, start, stop, "w")
        assert torch.equal(part.dequantize(), weight.dequantize()[:, start:stop])
    assert torch.equal(quantized_part(weight, 0, 4, 8, "w").dequantize(), weight.dequantize()[4:8])


@pytest.mark.parametrize("kind", ["act-order", "w8a8"])
def test_input_columns_no_rank_can_hold_alone_are_refused_pointing_to_exact_row_parallel(kind):
    blocks = BlockGrid(bits=4, group_size=32, symmetric=True).round_to_blocks(_weight())
    weights = {"act-order": ZeroPointTensor(blocks, None, torch.arange(128) // 64, torch.randperm(128)),
               "w8a8": quantize_weight(_weight())}
    with pytest.raises(UnsplittableWeightError, match="--exact-row-parallel"):
        quantized_part(weights[kind], 1, 0, 64, "down_proj.weight")
    assert quantized_part(weights[kind], 0, 0, 8, "down_proj.weight").shape == (8, 128)  # rows always split


# -- ranks on a GPTQ checkpoint ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gptq_folder(tmp_path_factory) -> Path:
    """A tiny Llama (4 heads of 16, inner 128) as an asymmetric 4-bit GPTQ checkpoint, groups of 32."""
    root = tmp_path_factory.mktemp("tp-gptq")
    source = save_tiny_model("llama", root / "float")
    write_checkpoint(source, root / "gptq", Variant(method="gptq", bits=4, group_size=32))
    return root / "gptq"


def _quantized_bytes(model: torch.nn.Module) -> int:
    return sum(m.qweight.numel() for m in model.modules() if isinstance(m, GGMLLinear))


def test_tp2_on_gptq_runs_zero_point_slices_exactly_as_one_process(gptq_folder, single_thread_torch):
    """Exact row layers: every rank's GPTQ layers are ZeroPointLinear slices; logits one process's bit for bit."""
    single = LLM(str(gptq_folder), **OPTIONS)
    parallel = LLM(str(gptq_folder), tensor_parallel_size=2, exact_row_parallel=True, **OPTIONS)
    try:
        layer = parallel.engine.runner.model.model.layers[0]
        assert isinstance(layer.self_attn.qkv_proj, ZeroPointLinear) and layer.self_attn.qkv_proj.out_features == 64  # of 128
        assert isinstance(layer.mlp.down_proj.local, ZeroPointLinear) and layer.mlp.down_proj.local.out_features == 32
        whole = _quantized_bytes(single.engine.runner.model)
        assert _quantized_bytes(parallel.engine.runner.model) == whole // 2
        for ours, reference in zip(prompt_logits(parallel, PROMPTS), prompt_logits(single, PROMPTS), strict=True):
            assert torch.equal(ours, reference)
        assert greedy_tokens(parallel, PROMPTS) == greedy_tokens(single, PROMPTS)
    finally:
        parallel.shutdown()


@pytest.mark.parametrize("switch", ["all-reduce", "sequence-parallel"])
def test_tp2_on_gptq_all_reduce_adds_only_the_quantized_partial_sums(gptq_folder, single_thread_torch, switch):
    """The all-reduce (or its reduce-scatter + all-gather halves): the numbers of one process whose quantized row
    layers add the ranks' partial sums; bit for bit, but for the token-split norms' SIMD tails (see test_tensor_parallel)."""
    single = LLM(str(gptq_folder), **OPTIONS)
    parallel = LLM(str(gptq_folder), tensor_parallel_size=2, enable_sequence_parallel=switch == "sequence-parallel", **OPTIONS)
    try:
        assert greedy_tokens(parallel, PROMPTS) == greedy_tokens(single, PROMPTS)
        assert max(parallel.engine.workers.memory.parameter_bytes) < 0.55 * parameter_bytes(single.engine.runner.model)
        assert_only_the_all_reduce_reorders(single, parallel, PROMPTS, tolerance=1e-6 if switch == "sequence-parallel" else 0.0)
    finally:
        parallel.shutdown()


def test_tp2_on_awq_runs_its_groups_sliced_and_adds_only_the_partial_sums(tmp_path, single_thread_torch):
    """AWQ GEMM checkpoints read into the same zero-point blocks as GPTQ: sliced the same way."""
    source = save_tiny_model("llama", tmp_path / "float")
    write_checkpoint(source, tmp_path / "awq", Variant(method="awq", bits=4, group_size=32))
    single = LLM(str(tmp_path / "awq"), **OPTIONS)
    parallel = LLM(str(tmp_path / "awq"), tensor_parallel_size=2, **OPTIONS)
    try:
        assert isinstance(parallel.engine.runner.model.model.layers[0].mlp.down_proj.local, ZeroPointLinear)
        assert greedy_tokens(parallel, PROMPTS) == greedy_tokens(single, PROMPTS)
        assert_only_the_all_reduce_reorders(single, parallel, PROMPTS)
    finally:
        parallel.shutdown()


def test_tp2_refuses_act_order_gptq_row_layers_it_cannot_split_and_runs_them_as_exact_rows(tmp_path, single_thread_torch):
    """Act-order columns are stored by group: no rank's input columns are one run of blocks; whole rows are."""
    source = save_tiny_model("llama", tmp_path / "float")
    write_checkpoint(source, tmp_path / "gptq", Variant(method="gptq", bits=4, group_size=32, act_order=True))
    with pytest.raises(ValueError, match=r"down_proj.weight \[64, 128\] is act-order .* --exact-row-parallel"):
        LLM(str(tmp_path / "gptq"), tensor_parallel_size=2, **OPTIONS)
    single = LLM(str(tmp_path / "gptq"), **OPTIONS)
    parallel = LLM(str(tmp_path / "gptq"), tensor_parallel_size=2, exact_row_parallel=True, **OPTIONS)
    try:
        assert greedy_tokens(parallel, PROMPTS) == greedy_tokens(single, PROMPTS)
    finally:
        parallel.shutdown()


def test_the_parallel_bench_runs_the_quantized_mode_and_reports_tok_s_and_bytes_per_rank(gptq_folder, single_thread_torch):
    """`ember bench parallel --dtype auto`: both engines on the GPTQ blocks; each rank holds about half of them."""
    result = run_parallel_bench(str(gptq_folder), ParallelConfig(tensor_parallel_size=2), num_prompts=2, prompt_len=8,
                                max_tokens=4, repeats=1, seed=0, dtype="auto")
    assert result["dtype"] == "auto" and result["parallel_output_tok_s"] > 0 and result["single_output_tok_s"] > 0
    assert max(result["rank_weight_bytes"]) < 0.55 * result["whole_weight_bytes"]
    assert result["bytes_per_token_counted"] == result["bytes_per_token_formula"]
    assert "| output tok/s, 1 process / tensor x2 |" in markdown(result) and "--dtype auto" in markdown(result)


# -- ranks on the SmolLM2 GGUF (Q4_1 layers, Q8_0 tied embeddings) ----------------------------------------------------


@pytest.mark.slow
def test_tp2_smollm2_gguf_at_auto_holds_half_the_blocks_and_greedy_matches_one_process(smollm2_gguf, single_thread_torch):
    """Exact row layers: greedy tokens equal to one process at --dtype auto, each rank under 0.6x the file.

    Logits are one process's bit for bit except where the Q8_0 head refines: it recomputes in float32 the logits
    near its own slice's top, and the slice without the greedy token has its top elsewhere (greedy is unaffected)."""
    options = dict(block_size=16, num_kv_blocks=64)
    single = LLM(str(smollm2_gguf), **options)
    parallel = LLM(str(smollm2_gguf), tensor_parallel_size=2, exact_row_parallel=True, **options)
    try:
        assert max(parallel.engine.workers.memory.parameter_bytes) <= 0.6 * smollm2_gguf.stat().st_size
        assert greedy_tokens(parallel, SMOLLM2_PROMPTS) == greedy_tokens(single, SMOLLM2_PROMPTS)
        for ours, reference in zip(prompt_logits(parallel, SMOLLM2_PROMPTS), prompt_logits(single, SMOLLM2_PROMPTS), strict=True):
            assert torch.equal(ours.max(dim=1).values, reference.max(dim=1).values)
            assert torch.equal(ours[:, : ours.shape[1] // 2], reference[:, : ours.shape[1] // 2])  # rank 0's slice
    finally:
        parallel.shutdown()


@pytest.mark.slow
def test_tp2_smollm2_gguf_at_auto_all_reduce_adds_only_the_quantized_partial_sums(smollm2_gguf, single_thread_torch):
    """Float32 activations (no int8 rounding to grow the all-reduce's last bit): one process's split sums, bit for bit."""
    options = dict(block_size=16, num_kv_blocks=64, quant_activations="float32")
    single = LLM(str(smollm2_gguf), **options)
    parallel = LLM(str(smollm2_gguf), tensor_parallel_size=2, **options)
    try:
        assert greedy_tokens(parallel, SMOLLM2_PROMPTS) == greedy_tokens(single, SMOLLM2_PROMPTS)
        assert_only_the_all_reduce_reorders(single, parallel, SMOLLM2_PROMPTS)
    finally:
        parallel.shutdown()


@pytest.mark.slow
def test_tp2_x_pp2_smollm2_gguf_at_auto_greedy_matches_one_process(smollm2_gguf, single_thread_torch):
    """Four ranks, each a stage's tensor-parallel half of its layers' blocks: about a quarter of the file each."""
    options = dict(block_size=16, num_kv_blocks=64)
    single = LLM(str(smollm2_gguf), **options)
    parallel = LLM(str(smollm2_gguf), tensor_parallel_size=2, pipeline_parallel_size=2, exact_row_parallel=True, **options)
    try:
        assert max(parallel.engine.workers.memory.parameter_bytes) <= 0.35 * smollm2_gguf.stat().st_size
        assert greedy_tokens(parallel, SMOLLM2_PROMPTS) == greedy_tokens(single, SMOLLM2_PROMPTS)
    finally:
        parallel.shutdown()
