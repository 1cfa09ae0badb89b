"""Mixtral (top-2 of 8), Qwen2-MoE (shared expert) and Qwen3-MoE (per-head q/k norms, no shared expert) against\ntransformers; grouped expert dispatch."""

from __future__ import annotations

import pytest
import torch
import transformers

from ember.config.model import MoEConfig
from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.layers.moe import GatedMLP, SparseMoE, group_by_expert, route_top_k
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_greedy_matches,
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)
from tests.parallel.moe_models import save_qwen3_moe

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB = 256
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _mixtral(folder):
    config = transformers.MixtralConfig(**TINY, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2)
    return save_random_model(transformers.MixtralForCausalLM, config, folder)


def _qwen2_moe(folder):
    config = transformers.Qwen2MoeConfig(
        **TINY,
        intermediate_size=96,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=False,
        mlp_only_layers=[0],
    )
    return save_random_model(transformers.Qwen2MoeForCausalLM, config, folder)


@pytest.fixture(scope="module", params=[_mixtral, _qwen2_moe, save_qwen3_moe], ids=["mixtral", "qwen2-moe", "qwen3-moe"])
def model_folder(request, tmp_path_factory):
    return request.param(tmp_path_factory.mktemp("moe"))


def test_prompt_logits_match_transformers(model_folder):
    assert_prompt_logits_match(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_greedy_generation_matches_transformers_alone_and_batched(model_folder):
    assert_greedy_matches(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def _moe_with_fixed_routes(num_experts: int = 4) -> SparseMoE:
    """A MoE whose router sends a token with feature i hot to experts i and i + 1 (mod E)."""
    torch.manual_seed(0)
    config = MoEConfig(num_experts=num_experts, num_experts_per_token=2, expert_intermediate_size=8)
    moe = SparseMoE(num_experts, config, GatedMLP)
    with torch.no_grad():
        moe.gate.weight.copy_(10 * (torch.eye(num_experts) + 0.5 * torch.eye(num_experts).roll(-1, 1)))
    return moe.eval()


def _dense_reference(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Every token through every expert, weighted by its top-k routing weights (zero elsewhere)."""
    weights, experts = route_top_k(moe.gate(x), moe.config)
    dense = torch.zeros(x.shape[0], moe.config.num_experts)
    dense.scatter_(1, experts, weights)
    outputs = torch.stack([expert(x) for expert in moe.experts], dim=1)  # [T, E, H]
    return (dense.unsqueeze(2) * outputs).sum(1)


def test_dispatch_sends_every_token_to_its_two_experts_when_all_experts_are_busy():
    moe = _moe_with_fixed_routes()
    x = torch.eye(4).repeat(3, 1)  # every expert is someone's first choice
    weights, experts = route_top_k(moe.gate(x), moe.config)
    dispatch = group_by_expert(weights, experts, 4)
    assert dispatch.tokens_per_expert == [6, 6, 6, 6]
    assert dispatch.token_indices[:6].tolist() == [0, 3, 4, 7, 8, 11]  # expert 0: tokens with feature 0 or 3 hot
    torch.testing.assert_close(moe(x), _dense_reference(moe, x), rtol=0, atol=1e-6)


def test_an_expert_no_token_chose_is_skipped_and_the_rest_still_add_up():
    moe = _moe_with_fixed_routes()
    x = torch.eye(4)[[0, 0, 1]]  # experts 0, 1 and 2 get tokens; expert 3 none
    weights, experts = route_top_k(moe.gate(x), moe.config)
    dispatch = group_by_expert(weights, experts, 4)
    assert dispatch.tokens_per_expert == [2, 3, 1, 0]
    torch.testing.assert_close(moe(x), _dense_reference(moe, x), rtol=0, atol=1e-6)


def test_a_forward_of_many_tokens_calls_each_chosen_expert_once_whatever_the_token_count(model_folder):
    """No per-token loop: one step of 60 prompt tokens runs each expert some token chose exactly
    once (on all its tokens), and no other expert, in every MoE layer."""
    engine = LLMEngine(EngineConfig(model=str(model_folder), cache=CacheConfig(block_size=4, num_kv_blocks=64)))
    layers = [module for module in engine.runner.model.modules() if isinstance(module, SparseMoE)]
    assert layers, "the model has no SparseMoE layer"
    calls: list[list[list[int]]] = [[[] for _ in layer.experts] for layer in layers]  # [layer][expert] -> rows per call
    routed: list[set[int]] = [set() for _ in layers]
    for index, layer in enumerate(layers):
        layer.gate.register_forward_hook(lambda _m, _i, logits, index=index: routed[index].update(route_top_k(logits, layers[index].config)[1].flatten().tolist()))
        for number, expert in enumerate(layer.experts):
            expert.register_forward_hook(lambda _m, inputs, _o, index=index, number=number: calls[index][number].append(inputs[0].shape[0]))
    for i, prompt in enumerate(make_prompts(VOCAB, (20, 25, 15))):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(max_tokens=1)))
    engine.step()
    assert engine.stats().computed_tokens_total == 60
    for index, layer in enumerate(layers):
        called = {number for number, rows in enumerate(calls[index]) if rows}
        assert all(len(rows) <= 1 for rows in calls[index]), f"layer {index}: an expert ran more than once"
        assert called == routed[index], f"layer {index}: experts run {called}, experts chosen {routed[index]}"
        assert sum(sum(rows) for rows in calls[index]) == 60 * layer.config.num_experts_per_token
