"""DeepSeek-V2 (MLA with absorbed decode, MoE with shared experts) against transformers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.overrides import TorchFunctionMode

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_greedy_matches,
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB = 256
KV_LORA_RANK = 16
ROPE_DIM = 8


YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=64,
    beta_fast=32,
    beta_slow=1,
    mscale=1.0,
    mscale_all_dim=0.8,  # unequal: both the cos/sin factor and the softmax temperature differ from 1
)


def _deepseek_v2(folder, q_lora_rank=None, rope_parameters=None, **routing):
    config = transformers.DeepseekV2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        n_routed_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
        kv_lora_rank=KV_LORA_RANK,
        q_lora_rank=q_lora_rank,
        qk_nope_head_dim=16,
        qk_rope_head_dim=ROPE_DIM,
        v_head_dim=12,
        rope_parameters=rope_parameters,
        **routing,
    )
    return save_random_model(transformers.DeepseekV2ForCausalLM, config, folder)


# One group of two experts per token: unlike greedy top-2, whose experts may come from two groups.
GROUP_LIMITED = dict(topk_method="group_limited_greedy", n_group=3, topk_group=1)


@pytest.fixture(
    scope="module",
    params=[(None, None, {}), (24, None, {}), (None, YARN, GROUP_LIMITED)],
    ids=["q-full", "q-lora", "yarn-group-limited"],
)
def model_folder(request, tmp_path_factory):
    q_lora_rank, rope_parameters, routing = request.param
    return _deepseek_v2(tmp_path_factory.mktemp("deepseek"), q_lora_rank, rope_parameters, **routing)


def test_prompt_logits_match_transformers(model_folder):
    assert_prompt_logits_match(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_greedy_generation_with_absorbed_decode_matches_transformers(model_folder):
    assert_greedy_matches(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_the_engine_allocates_exactly_the_latent_bytes_per_token(tmp_path):
    folder = _deepseek_v2(tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), cache=CacheConfig(block_size=4, num_kv_blocks=10)))
    num_layers, element_size = 2, 4
    latent_bytes_per_token = num_layers * (KV_LORA_RANK + ROPE_DIM) * element_size
    assert engine.runner.kv_cache_bytes == 10 * 4 * latent_bytes_per_token
    # The same attention as MHA would cache per head a key (16 + 8) and a value (12).
    mha_bytes_per_token = num_layers * 4 * (16 + ROPE_DIM + 12) * element_size
    assert latent_bytes_per_token * 6 == mha_bytes_per_token  # 192 vs 1152 bytes


class LinearCallCounter(TorchFunctionMode):
    """Counts `F.linear` calls whose weight is one of `weights` (identity, not equality), whoever makes them."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.weights = weights
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            self.count += any(weight is candidate for candidate in self.weights)
        return func(*args, **kwargs)


def test_decode_steps_never_expand_the_latent(tmp_path):
    """Prefill multiplies latents by kv_b_proj (the positive control: the counter sees it); decode
    steps use its weight only folded into queries and outputs, never as a linear on the latents."""
    folder = _deepseek_v2(tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), cache=CacheConfig(block_size=4, num_kv_blocks=64)))
    weights = [layer.self_attn.kv_b_proj.weight for layer in engine.runner.model.model.layers]
    engine.add_request(EngineRequest("r", list(range(1, 30)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
    expansions_per_step = []
    while engine.has_unfinished_requests():
        with LinearCallCounter(weights) as counter:
            engine.step()
        expansions_per_step.append(counter.count)
    assert engine.stats().generation_tokens_total == 8
    assert expansions_per_step[0] == len(weights)  # the prefill step: one expansion per layer
    assert expansions_per_step[1:] == [0] * 7  # seven decode steps, none expanding
