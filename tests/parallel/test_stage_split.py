"""Pipeline stage boundaries: stage 0 carries the embedding and head, so it takes fewer layers."""

import pytest

from ember.config.model import ModelConfig, MoEConfig
from ember.parallel.sharding import Span
from ember.parallel.stage_split import first_stage_parameters, layer_parameters, stage_spans

SMOLLM2_SHAPE = dict(
    architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
)


def _stage_totals(config: ModelConfig, spans: list[Span]) -> list[int]:
    totals = [sum(layer_parameters(config, layer) for layer in range(span.start, span.stop)) for span in spans]
    totals[0] += first_stage_parameters(config)
    return totals


def test_smollm2_layer_weights_and_its_tied_table_count_once():
    config = ModelConfig(**SMOLLM2_SHAPE)
    assert layer_parameters(config, 0) == 576 * (2 * 576 + 2 * 192) + 3 * 576 * 1536  # 3.54M: q, k, v, o, MLP
    assert first_stage_parameters(config) == 49152 * 576


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_heaviest_stage_is_as_light_as_any_contiguous_split_allows(stages):
    config = ModelConfig(**SMOLLM2_SHAPE)
    spans = stage_spans(config, stages)
    assert [s.start for s in spans[1:]] == [s.stop for s in spans[:-1]] and spans[0].start == 0 and spans[-1].stop == 30
    assert all(span.size >= 1 for span in spans)
    heaviest = max(_stage_totals(config, spans))
    # Against every split with the boundaries moved by one layer either way: none is lighter.
    for i in range(1, stages):
        for shift in (-1, 1):
            bounds = [0, *(s.stop for s in spans[:-1]), 30]
            bounds[i] += shift
            if all(b < c for b, c in zip(bounds, bounds[1:], strict=False)):
                moved = [Span(b, c) for b, c in zip(bounds, bounds[1:], strict=False)]
                assert max(_stage_totals(config, moved)) >= heaviest
    whole = first_stage_parameters(config) + 30 * layer_parameters(config, 0)
    assert heaviest <= 1.15 * whole / stages


def test_two_stages_give_stage_0_eleven_of_thirty_layers_where_an_even_split_gave_fifteen():
    assert stage_spans(ModelConfig(**SMOLLM2_SHAPE), 2) == [Span(0, 11), Span(11, 30)]


def test_moe_layers_weigh_their_experts_and_dense_layers_their_mlp():
    moe = MoEConfig(num_experts=8, num_experts_per_token=2, expert_intermediate_size=64, dense_layers=(0,))
    config = ModelConfig(**{**SMOLLM2_SHAPE, "num_layers": 4, "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2,
                            "head_dim": 8, "intermediate_size": 128, "vocab_size": 100, "moe": moe})
    attention = 32 * (2 * 32 + 2 * 16)
    assert layer_parameters(config, 0) == attention + 3 * 32 * 128
    assert layer_parameters(config, 1) == attention + 8 * 3 * 32 * 64 + 32 * 8


def test_more_stages_than_layers_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="at most 30 stages"):
        stage_spans(ModelConfig(**SMOLLM2_SHAPE), 31)
