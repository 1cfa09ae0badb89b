"""`ember kv`: the planner's table from a known shape, a config.json and a loaded checkpoint."""

from __future__ import annotations

import json

import transformers

from ember.cli.main import main
from tests.models.family_parity import save_random_model


def test_known_shape_prints_bytes_per_token_and_sequences_that_fit(capsys):
    assert main(["kv", "llama-2-7b", "--dtype", "float16", "--context", "4096", "--memory", "24GB"]) == 0
    out = capsys.readouterr().out
    assert "524288 bytes/token" in out
    assert "2.15 GB per 4096-token sequence" in out
    assert "11 sequences of 4096 tokens fit in 24 GB" in out


def test_compare_prints_mha_gqa_mqa_and_mla_and_writes_a_png(tmp_path, capsys):
    chart = tmp_path / "kv.png"
    assert main(["kv", "--compare", "--plot", str(chart)]) == 0
    out = capsys.readouterr().out
    for row in ("MHA ", "GQA-8", "MQA", "MLA"):
        assert row in out
    assert "537 MB" in out and "2.15 GB" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_config_json_is_planned_without_loading_weights(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(
        model_type="qwen2", vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1,
    )))
    assert main(["kv", str(config), "--dtype", "float32", "--context", "10"]) == 0
    out = capsys.readouterr().out
    assert "MQA" in out and "256 bytes/token" in out  # 2 layers * 2 * 1 head * 16 * 4 bytes


def test_an_mla_checkpoint_shows_the_engine_allocation_equal_to_the_latent_formula(tmp_path, capsys):
    config = transformers.DeepseekV2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        n_shared_experts=1, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
    )
    folder = save_random_model(transformers.DeepseekV2ForCausalLM, config, tmp_path / "ds")
    assert main(["kv", str(folder), "--dtype", "float32", "--context", "64"]) == 0
    out = capsys.readouterr().out
    assert "formula: 160 bytes/token" in out  # 2 layers * (16 + 4) * 4 bytes
    assert "engine allocated: 160 bytes/token (matches the formula)" in out
    assert "4x this model's" in out  # MHA: 2 layers * 4 heads * (8 + 4 + 8) * 4 bytes = 640


def test_an_fp8_cache_shows_the_engine_allocating_one_byte_per_element_and_what_it_fits(tmp_path, capsys):
    from tests.model_factory import save_tiny_model

    folder = save_tiny_model("llama", tmp_path / "llama")  # 2 layers, 2 KV heads of 16
    assert main(["kv", str(folder), "--dtype", "fp8", "--context", "64", "--memory", "1MiB"]) == 0
    out = capsys.readouterr().out
    assert "formula: 128 bytes/token" in out  # 2 layers * (K, V) * 2 heads * 16 * 1 byte
    assert "engine allocated: 128 bytes/token (matches the formula)" in out
    # 1 MiB / (64 tokens * bytes per token): 32 float32 sequences, 64 bfloat16, 128 fp8
    assert "sequences that fit by KV cache dtype (--kv-cache-dtype): float32 32, bfloat16 64, fp8 128" in out


def test_int8_is_planned_by_formula_only(tmp_path, capsys):
    from tests.model_factory import save_tiny_model

    folder = save_tiny_model("llama", tmp_path / "llama")
    assert main(["kv", str(folder), "--dtype", "int8", "--context", "64"]) == 0
    out = capsys.readouterr().out
    assert "formula only, the engine has no int8 KV cache" in out and "engine allocated" not in out
