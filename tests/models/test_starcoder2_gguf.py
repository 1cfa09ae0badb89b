"""StarCoder2 from a GGUF file as llama.cpp's converter writes it (arch `starcoder2`), against transformers."""

from __future__ import annotations

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
            "model.norm.bias": "output_norm.bias", "lm_head.weight": "output.weight"}  # fmt: skip
_PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # fmt: skip


def _gguf_name(name: str) -> str:
    if name in _GLOBALS:
        return _GLOBALS[name]
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_PARTS[part]}.{kind}"


def write_starcoder2_gguf(folder, path, qtype: GGMLQuantizationType | None = None) -> None:
    """The HF model in `folder` under llama.cpp's starcoder2 names and keys (no q/k reordering: its converter permutes
    only Llama-family rows); matrices in `qtype` (None: float32); the head left out when tied."""
    reference = load_reference(folder)
    config = reference.config
    writer = GGUFWriter(str(path), "starcoder2")
    add_shape_metadata(writer, config)
    writer.add_layer_norm_eps(config.norm_epsilon)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    for name, tensor in reference.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.float().numpy()
        if qtype is None or values.ndim == 1:
            writer.add_tensor(_gguf_name(name), values)
        else:
            raw = quantize(values, qtype)
            writer.add_tensor(_gguf_name(name), raw, raw_shape=raw.shape, raw_dtype=qtype)
    finish_gguf(writer)


def _starcoder2(**overrides) -> transformers.Starcoder2Config:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, eos_token_id=None)  # fmt: skip
    return transformers.Starcoder2Config(**{**settings, **overrides})


@pytest.mark.parametrize("overrides", [{}, {"use_bias": False, "tie_word_embeddings": False}], ids=["tied-biases", "untied-no-bias"])
def test_a_starcoder2_gguf_matches_transformers(tmp_path, overrides):
    folder = save_random_model(transformers.Starcoder2ForCausalLM, _starcoder2(**overrides), tmp_path / "hf")
    write_starcoder2_gguf(folder, tmp_path / "model.gguf")
    assert_prompt_logits_match(tmp_path / "model.gguf", load_reference(folder), make_prompts(VOCAB))


def test_a_quantized_starcoder2_gguf_runs_in_its_blocks_like_its_float_copy(tmp_path):
    from ember.quant.ggml_layers import GGMLLinear

    folder = save_random_model(transformers.Starcoder2ForCausalLM, _starcoder2(), tmp_path / "hf")
    write_starcoder2_gguf(folder, tmp_path / "q8.gguf", GGMLQuantizationType.Q8_0)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = make_prompts(VOCAB)[3]
    blocks = LLM(str(tmp_path / "q8.gguf"), dtype="auto", block_size=4, num_kv_blocks=128)
    floats = LLM(str(tmp_path / "q8.gguf"), dtype="float32", block_size=4, num_kv_blocks=128)
    assert any(isinstance(module, GGMLLinear) for module in blocks.engine.runner.model.modules())
    assert blocks.generate([prompt], params)[0].outputs[0].token_ids == floats.generate([prompt], params)[0].outputs[0].token_ids
