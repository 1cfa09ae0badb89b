"""The KV planner's formula on known shapes: the seed's Llama-2 figures, MLA, windows, fits."""

from __future__ import annotations

from ember.config.model import ModelConfig
from ember.models.family_registry import config_from_hf
from ember.models.kv_planner import KNOWN_SHAPES, compare_variants, plan


def _config(name: str) -> ModelConfig:
    return config_from_hf(KNOWN_SHAPES[name])


def test_llama_2_7b_at_4096_tokens_in_fp16_costs_two_gib_with_mha_and_a_quarter_with_gqa_8():
    variants = dict(compare_variants(_config("llama-2-7b")))
    mha = plan("mha", variants["MHA"], "float16", 4096)
    gqa = plan("gqa", variants["GQA-8"], "float16", 4096)
    assert mha.bytes_per_token == 2 * 32 * 32 * 128 * 2  # 2 * L * n_kv * d_h * bytes
    assert mha.bytes_per_sequence == 2 * 2**30
    assert gqa.bytes_per_sequence == 512 * 2**20
    assert mha.bytes_per_sequence == 4 * gqa.bytes_per_sequence


def test_llama_2_13b_with_mha_is_the_seeds_3_3_gb():
    result = plan("13b", _config("llama-2-13b"), "float16", 4096)
    assert round(result.bytes_per_sequence / 1e9, 1) == 3.4


def test_mla_caches_the_latent_and_rope_key_per_layer():
    result = plan("lite", _config("deepseek-v2-lite"), "bfloat16", 1000)
    assert result.bytes_per_token == 27 * (512 + 64) * 2
    assert result.mha_bytes_per_token == 27 * 16 * (128 + 64 + 128) * 2
    assert round(result.ratio_to_mha, 2) == 8.89


def test_a_windowed_model_pays_for_its_window_only():
    result = plan("mistral", _config("mistral-7b-v0.1"), "float16", 32768)
    assert result.bytes_per_sequence == 2 * 32 * 8 * 128 * 2 * 4096


def test_sequences_that_fit_count_whole_blocks():
    # One block of 16 tokens costs 16 * 512 KiB = 8 MiB; a 4096-token sequence 256 blocks = 2 GiB.
    result = plan("7b", _config("llama-2-7b"), "float16", 4096, memory_bytes=5 * 2**30, block_size=16)
    assert result.num_sequences == 2
