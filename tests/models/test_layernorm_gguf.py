"""LayerNorm families from GGUF files as llama.cpp's converter writes them (StarCoder2 `starcoder2`, Phi-2 `phi2`,
StableLM `stablelm`), against transformers."""

from __future__ import annotations

import numpy as np
import pytest
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)
from tests.models.test_gguf_loader import add_shape_metadata, finish_gguf

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB = 320
_GLOBALS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "model.norm.bias": "output_norm.bias", "model.final_layernorm.weight": "output_norm.weight",
            "model.final_layernorm.bias": "output_norm.bias", "lm_head.weight": "output.weight", "lm_head.bias": "output.bias"}  # fmt: skip
_PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip


def _gguf_name(name: str) -> str:
    if name in _GLOBALS:
        return _GLOBALS[name]
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_PARTS[part]}.{kind}"


def write_layernorm_gguf(folder, path, architecture: str, qtype: GGMLQuantizationType | None = None,
                         extra: dict[str, np.ndarray] | None = None) -> None:
    """The HF model in `folder` under llama.cpp's names and keys for `architecture` (no q/k reordering: its converter
    permutes only Llama-family rows; the rotated width as rope.dimension_count); matrices in `qtype` (None:
    float32); the head left out when tied; `extra` tensors added as they are."""
    reference = load_reference(folder)
    config = reference.config
    writer = GGUFWriter(str(path), architecture)
    add_shape_metadata(writer, config)
    writer.add_layer_norm_eps(getattr(config, "norm_epsilon", None) or config.layer_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    head_dim = config.hidden_size // config.num_attention_heads
    writer.add_rope_dimension_count(int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0)))
    for name, tensor in reference.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.float().numpy()
        if qtype is None or values.ndim == 1:
            writer.add_tensor(_gguf_name(name), values)
        else:
            raw = quantize(values, qtype)
            writer.add_tensor(_gguf_name(name), raw, raw_shape=raw.shape, raw_dtype=qtype)
    for name, values in (extra or {}).items():
        writer.add_tensor(name, values)
    finish_gguf(writer)


def _starcoder2(**overrides) -> transformers.Starcoder2Config:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, eos_token_id=None)  # fmt: skip
    return transformers.Starcoder2Config(**{**settings, **overrides})


def _phi2(**overrides) -> transformers.PhiConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=256, partial_rotary_factor=0.5, eos_token_id=None)  # fmt: skip
    return transformers.PhiConfig(**{**settings, **overrides})


def _stablelm(**overrides) -> transformers.StableLmConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, eos_token_id=None)  # fmt: skip
    return transformers.StableLmConfig(**{**settings, **overrides})


@pytest.mark.parametrize(("model_class", "config", "architecture"), [
    (transformers.Starcoder2ForCausalLM, _starcoder2(), "starcoder2"),
    (transformers.Starcoder2ForCausalLM, _starcoder2(use_bias=False, tie_word_embeddings=False), "starcoder2"),
    (transformers.PhiForCausalLM, _phi2(), "phi2"),
    (transformers.StableLmForCausalLM, _stablelm(), "stablelm"),
    (transformers.StableLmForCausalLM, _stablelm(use_qkv_bias=True, use_parallel_residual=True), "stablelm"),
], ids=["starcoder2-tied-biases", "starcoder2-untied-no-bias", "phi2", "stablelm-3b", "stablelm-2-parallel"])  # fmt: skip
def test_a_gguf_as_llama_cpp_writes_it_matches_transformers(tmp_path, model_class, config, architecture):
    folder = save_random_model(model_class, config, tmp_path / "hf")
    write_layernorm_gguf(folder, tmp_path / "model.gguf", architecture)
    assert_prompt_logits_match(tmp_path / "model.gguf", load_reference(folder), make_prompts(VOCAB))


def test_a_quantized_starcoder2_gguf_runs_in_its_blocks_like_its_float_copy(tmp_path):
    from ember.quant.ggml.layers import GGMLLinear

    folder = save_random_model(transformers.Starcoder2ForCausalLM, _starcoder2(), tmp_path / "hf")
    write_layernorm_gguf(folder, tmp_path / "q8.gguf", "starcoder2", GGMLQuantizationType.Q8_0)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = make_prompts(VOCAB)[3]
    blocks = LLM(str(tmp_path / "q8.gguf"), dtype="auto", block_size=4, num_kv_blocks=128)
    floats = LLM(str(tmp_path / "q8.gguf"), dtype="float32", block_size=4, num_kv_blocks=128)
    assert any(isinstance(module, GGMLLinear) for module in blocks.engine.runner.model.modules())
    assert blocks.generate([prompt], params)[0].outputs[0].token_ids == floats.generate([prompt], params)[0].outputs[0].token_ids


def test_a_stablelm_gguf_with_per_head_qk_norms_is_refused_by_name(tmp_path):
    folder = save_random_model(transformers.StableLmForCausalLM, _stablelm(), tmp_path / "hf")
    norms = {f"blk.{layer}.attn_{kind}_norm.weight": np.ones((4, 16), dtype=np.float32) for layer in range(2) for kind in "qk"}
    write_layernorm_gguf(folder, tmp_path / "model.gguf", "stablelm", extra=norms)
    with pytest.raises(ValueError, match="per-head q/k norms"):
        LLM(str(tmp_path / "model.gguf"))
