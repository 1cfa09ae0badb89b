"""The LM head over GGML blocks: int8 activations, float32-exact wherever a logit could be its row's largest."""

from __future__ import annotations

import pytest
import torch

from ember.quant.ggml.interleave import is_interleaved
from ember.quant.ggml.kernels import GEMV_PATHS
from ember.quant.ggml.layers import (
    GGMLEmbedding,
    GGMLLinear,
    GGMLLogitsLinear,
    ggml_linear,
    install_ggml_layers,
    round_to_int8_blocks,
)
from ember.quant.int8.exact_top_logits import (
    BFLOAT16_UNIT_ROUNDOFF,
    ROWS_PER_RECOMPUTATION,
    refine_near_top,
    row_norms,
)
from tests.quant.ggml_factory import random_blocks

VOCAB, HIDDEN = 512, 256


def _near_ties(name: str, seed: int, count: int = 32) -> tuple:
    """A random head and `count` inputs, each tying two of its rows' float logits at the top (x has equal dot products
    with both rows): which one wins is left to the last bits, so the int8 product's rounding decides many of them."""
    weight = random_blocks(name, rows=VOCAB, cols=HIDDEN, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    dense = weight.dequantize()
    pairs = torch.randperm(VOCAB, generator=generator)[: 2 * count].view(count, 2)
    a, b = dense[pairs[:, 0]], dense[pairs[:, 1]]
    u = (a + b) / (a + b).norm(dim=1, keepdim=True) * 30
    difference = a - b
    x = u - ((difference * u).sum(1, keepdim=True) / (difference * difference).sum(1, keepdim=True)) * difference
    return weight, x


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
def test_greedy_choices_are_the_float32_heads_where_int8_alone_flips_them(int8_kernels, name):
    flipped = 0
    for seed in range(3):
        weight, x = _near_ties(name, seed)
        head = GGMLLogitsLinear(weight, activations="int8")
        float_head = GGMLLinear(weight, activations="float32")
        int8_head = GGMLLinear(weight, activations="int8")
        assert is_interleaved(head.stored_blocks)
        ours, reference, int8_only = head(x), float_head(x), int8_head(x)
        flipped += int((int8_only.argmax(1) != reference.argmax(1)).sum())
        assert torch.equal(ours.argmax(1), reference.argmax(1))
        top = reference.argmax(1, keepdim=True)
        assert torch.equal(ours.gather(1, top), reference.gather(1, top))  # recomputed with float32 activations
    assert flipped > 0  # the test would fail without the recomputation


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K"])
def test_a_many_row_head_on_amx_tiles_still_picks_the_float32_argmax(int8_kernels, name):
    """Where AMX runs many-row products on tiles (x and w rounded to bfloat16), the bound adds the weights' rounding:
    every tile logit lies within it, and the refined argmax is the float32 head's where the tiles alone flip some."""
    if int8_kernels.tile_rows is None:
        pytest.skip("this CPU (or its kernel build) has no AMX tiles")
    weight, x = _near_ties(name, seed=9, count=int8_kernels.tile_rows + 32)
    tiles = GGMLLinear(weight, activations="int8")(x)
    reference = ggml_linear(x, weight, None, activations="float32", tiles=False)  # the float32 head's passes, any rows
    norms = row_norms(lambda start, stop: weight.dequantize()[start:stop], VOCAB)
    rounded = x.bfloat16().float()
    radius = (x - rounded).norm(dim=1, keepdim=True) + BFLOAT16_UNIT_ROUNDOFF * rounded.norm(dim=1, keepdim=True)
    assert torch.all((tiles - reference).abs() <= norms * radius * 1.01)
    assert not torch.equal(tiles.argmax(1), reference.argmax(1))  # the tiles' rounding flips near ties
    assert torch.equal(GGMLLogitsLinear(weight)(x).argmax(1), reference.argmax(1))


def test_every_int8_logit_lies_within_its_bound_and_only_candidates_are_recomputed(int8_kernels):
    weight, x = _near_ties("Q8_0", seed=5)
    norms = row_norms(lambda start, stop: weight.dequantize()[start:stop], VOCAB, chunk_rows=100)
    assert torch.all(norms >= weight.dequantize().norm(dim=1))
    int8 = GGMLLinear(weight, activations="int8")(x)
    reference = GGMLLinear(weight, activations="float32")(x)
    error = (x - round_to_int8_blocks(x)).norm(dim=1, keepdim=True)
    assert torch.all((int8 - reference).abs() <= norms * error * 1.01)
    calls = []
    head = GGMLLogitsLinear(weight)

    def exact(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        calls.append((rows.shape[0], ids))
        return head._exact(rows, ids)

    refined = int8.clone()
    replaced = refine_near_top(refined, x, round_to_int8_blocks(x), norms, exact)
    assert [rows for rows, _ in calls] == [ROWS_PER_RECOMPUTATION] * (len(x) // ROWS_PER_RECOMPUTATION)
    assert replaced == sum(ids.numel() for _, ids in calls) < len(calls) * VOCAB // 8  # a few per row, not the vocabulary
    for block, (rows, ids) in enumerate(calls):
        block_rows = slice(block * rows, (block + 1) * rows)
        untouched = torch.ones(VOCAB, dtype=torch.bool)
        untouched[ids] = False
        assert torch.equal(refined[block_rows][:, untouched], int8[block_rows][:, untouched])
        assert torch.equal(refined[block_rows][:, ids], reference[block_rows][:, ids])
    assert torch.equal(refined.argmax(1), reference.argmax(1))


def test_float32_activations_skip_the_recomputation(int8_kernels):
    weight, x = _near_ties("Q8_0", seed=6)
    head = GGMLLogitsLinear(weight, activations="float32")
    assert int8_kernels.format_path(head.format, head.activations) != GEMV_PATHS.index("int8")
    assert torch.equal(head(x), GGMLLinear(weight, activations="float32")(x))


def test_a_tied_table_is_held_once_and_the_embedding_reads_the_heads_interleaved_blocks(int8_kernels):
    table = random_blocks("Q8_0", rows=VOCAB, cols=HIDDEN, seed=7)
    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN, device="meta")
    model.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False, device="meta")
    install_ggml_layers(model, {"embed_tokens.weight": table, "lm_head.weight": table})
    assert isinstance(model.lm_head, GGMLLogitsLinear) and isinstance(model.embed_tokens, GGMLEmbedding)
    assert model.embed_tokens.qweight.data_ptr() == model.lm_head.qweight.data_ptr()
    ids = torch.tensor([[0, 3, 511], [8, 8, 100]])
    assert torch.equal(model.embed_tokens(ids), table.dequantize()[ids])
    assert torch.equal(model.embed_tokens.weight_blocks.data, table.data)


def test_the_head_keeps_its_inputs_shape_and_dtype(int8_kernels):
    weight, x = _near_ties("Q8_0", seed=8)
    head = GGMLLogitsLinear(weight)
    batched = head(x.view(4, 8, HIDDEN))
    assert batched.shape == (4, 8, VOCAB) and torch.equal(batched.view(32, VOCAB), head(x))
    assert head(x.bfloat16()).dtype == torch.bfloat16
