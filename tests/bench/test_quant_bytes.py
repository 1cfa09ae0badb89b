"""`ember bench quant`'s weight accounting: blocks, packed float panels and tied tables, counted exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.bench.quant import weight_bytes
from ember.layers import cpu_gemm
from ember.layers.linear import Linear, pack_linear_weights
from ember.quant.codes.grid import BlockGrid
from ember.quant.ggml.layers import GGMLEmbedding, GGMLLinear


class TinyQuantized(nn.Module):
    """A Q8_0 table shared with the head, a g128 Q4_1 linear, a packable float linear and a norm weight."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        table = BlockGrid(8, 32).fake_quantize(torch.randn(64, 256, generator=generator))
        table_blocks = _blocks(table, BlockGrid(8, 32))
        self.embed = GGMLEmbedding(table_blocks)
        self.head = GGMLLinear(table_blocks, activations="float32")  # as the loader builds a tied LM head
        self.proj = GGMLLinear(_blocks(torch.randn(96, 256, generator=generator), BlockGrid(4, 128)))
        self.dense = Linear(256, 48, bias=False)
        self.norm = nn.Parameter(torch.ones(256))


def _blocks(weight: torch.Tensor, grid: BlockGrid):
    d, m = grid.fit(weight)
    cols = weight.shape[1]
    return grid.to_blocks(grid.quantize(weight, grid.per_column(d, cols), grid.per_column(m, cols)), d, m)


def test_blocks_count_once_and_packed_float_layers_count_through_the_state_dict():
    if cpu_gemm.load_gemm() is None:
        pytest.skip("no compiled GEMM here: nothing gets packed")
    model = TinyQuantized()
    assert model.head.qweight.data_ptr() == model.embed.qweight.data_ptr()  # one copy of the tied table
    before = weight_bytes(model)
    assert pack_linear_weights(model) == 1 and model.dense.weight is None
    after = weight_bytes(model)
    assert after == before  # packing moves the weight into panels; the accounting still sees it
    q8, q4 = 64 * 256 // 32 * 34, 96 * 256 // 32 * 20
    assert after.memory_bytes == q8 + q4 + (48 * 256 + 256) * 4
    assert after.parameters == 64 * 256 + 96 * 256 + 48 * 256 + 256
    # Nominal: Q8_0 keeps one fp16 scale per 32 values; the g128 Q4_1 one (d, m) pair per 128.
    assert after.nominal_bytes == 64 * 256 * (1 + 2 / 32) + 96 * 256 * (0.5 + 4 / 128) + (48 * 256 + 256) * 4


def test_scale_group_size_reads_the_grid_from_the_blocks():
    weight = torch.randn(8, 512, generator=torch.Generator().manual_seed(1))
    assert [_blocks(weight, BlockGrid(4, g)).scale_group_size() for g in (32, 128, 512)] == [32, 128, 512]
    assert _blocks(weight, BlockGrid(8, 256)).scale_group_size() == 256


def test_a_method_the_models_family_cannot_take_is_listed_as_not_run(shared_dir, tmp_path):
    import shutil

    from ember.bench.quant import QuantBenchOptions, bench_quant
    from ember.bench.report_features import quant_markdown
    from tests.model_factory import save_tiny_model

    tokenizer = shared_dir / "tokenizers" / "smollm2" / "tokenizer.json"
    if not tokenizer.is_file():
        pytest.skip(f"{tokenizer} is missing from the shared assets")
    model = save_tiny_model("mixtral", tmp_path / "mixtral", vocab_size=49152, max_position_embeddings=1024)
    shutil.copy(tokenizer, model / "tokenizer.json")
    corpus = shared_dir / "corpus"
    options = QuantBenchOptions(model=str(model), calib=corpus / "tinyshakespeare.txt", eval_file=corpus / "botchan.txt",
                                methods=("rtn4", "awq4"), eval_windows=1, calib_tokens=512)
    section = bench_quant(options, time_kernels=False)
    assert [row["name"].split()[0] for row in section["rows"]] == ["float32", "checkpoint", "rtn4"]
    assert "experts or post-norm blocks" in section["not_run"]["awq4"]
    text = "\n".join(quant_markdown(section, lambda header, rows: [str(header), *map(str, rows)], lambda lines, key: None))
    assert "Not run on this model: awq4" in text
