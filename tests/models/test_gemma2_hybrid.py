"""Gemma 2 (alternating local/global layers, soft-capping, four norms) and Gemma (1) against transformers."""

from __future__ import annotations

import json

import pytest
import transformers

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


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    config = transformers.Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=12,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=1.0,  # small caps so the tanh really bends the tiny model's scores
        final_logit_softcapping=2.0,
        attn_implementation="eager",
    )
    return save_random_model(transformers.Gemma2ForCausalLM, config, tmp_path_factory.mktemp("gemma2"))


def test_prompt_logits_match_transformers_past_the_window(model_folder):
    assert_prompt_logits_match(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_greedy_generation_past_the_window_matches_transformers(model_folder):
    llm = assert_greedy_matches(model_folder, load_reference(model_folder), make_prompts(VOCAB))
    assert llm.engine.kv.group_windows == (12, None)


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    """Gemma (1): two norms a block, no windows or soft-capping; one KV head (MQA, as Gemma-2B)."""
    config = transformers.GemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
    return save_random_model(transformers.GemmaForCausalLM, config, tmp_path_factory.mktemp("gemma"))


def test_gemma_prompt_logits_and_greedy_generation_match_transformers(gemma_folder):
    reference = load_reference(gemma_folder)
    assert_prompt_logits_match(gemma_folder, reference, make_prompts(VOCAB))
    assert_greedy_matches(gemma_folder, reference, make_prompts(VOCAB))


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory):
    """Gemma 3 (text): five sliding layers to one global, q/k head norms, a rotary base per layer type."""
    config = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=12,
                                           query_pre_attn_scalar=16, max_position_embeddings=256,
                                           eos_token_id=None)  # transformers' min_new_tokens would hold EOS back
    return save_random_model(transformers.Gemma3ForCausalLM, config, tmp_path_factory.mktemp("gemma3"))


def test_gemma3_prompt_logits_and_greedy_generation_past_the_window_match_transformers(gemma3_folder):
    reference = load_reference(gemma3_folder)
    assert_prompt_logits_match(gemma3_folder, reference, make_prompts(VOCAB))
    llm = assert_greedy_matches(gemma3_folder, reference, make_prompts(VOCAB))
    assert llm.engine.kv.group_windows == (12, None)
    model = llm.engine.runner.model
    assert model.local_rotary is not None and model.config.local_rope_theta == 10_000.0 and model.config.rope_theta == 1e6


def test_a_gemma3_config_in_transformers_4s_spelling_reads_the_same():
    """rope_theta / rope_local_base_freq / sliding_window_pattern (as the published Gemma 3 configs still read) give the
    layers, windows and bases that transformers 5's rope_parameters and layer_types give."""

    current = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=12).to_dict()
    from ember.models.family_registry import config_from_hf

    older = {k: v for k, v in current.items() if k not in ("rope_parameters", "layer_types")}
    older.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rope_scaling=None, sliding_window_pattern=6)
    new, old = config_from_hf(current), config_from_hf(older)
    assert old == new
    assert new.layer_windows == (12, 12, 12, 12, 12, None, 12)
    assert (new.rope_theta, new.local_rope_theta) == (1_000_000.0, 10_000.0)


@pytest.fixture(scope="module")
def gemma3_image_text_folder(tmp_path_factory):
    """An image-text Gemma 3 (Gemma3ForConditionalGeneration: its language model under language_model.*, a vision
    tower beside it) whose config.json lists in text_config only what differs from transformers' defaults, as the
    published 4B / 12B / 27B configs do."""
    text = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=12,
                                         max_position_embeddings=256, eos_token_id=None)
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                             image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                       image_token_index=VOCAB - 1, boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2)
    folder = save_random_model(transformers.Gemma3ForConditionalGeneration, config, tmp_path_factory.mktemp("gemma3-it"))
    written = json.loads((folder / "config.json").read_text())
    shown = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "sliding_window", "max_position_embeddings")
    written["text_config"] = {key: written["text_config"][key] for key in shown}
    (folder / "config.json").write_text(json.dumps(written))
    return folder


def test_an_image_text_gemma3_checkpoint_runs_its_language_model_as_transformers_does(gemma3_image_text_folder):
    from ember.llm import LLM

    reference = transformers.Gemma3ForConditionalGeneration.from_pretrained(gemma3_image_text_folder).eval()
    prompts = make_prompts(VOCAB - 3)  # below the image tokens
    assert_prompt_logits_match(gemma3_image_text_folder, reference, prompts)
    llm = LLM(str(gemma3_image_text_folder), block_size=4, num_kv_blocks=128)
    assert llm.engine.model_config.layer_windows == (12, 12, 12, 12, 12, None, 12)  # the default pattern: 6
    assert not any("vision" in name for name, _ in llm.engine.runner.model.named_parameters())


# transformers' Gemma names -> llama.cpp's GGUF names (its converter's table), per block and for the whole model
_GEMMA_GGUF_PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                     "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                     "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                     "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
                     "post_feedforward_layernorm": "post_ffw_norm"}
_GEMMA_GGUF_GLOBALS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}


def _gemma_gguf_name(name: str, architecture: str) -> str:
    if name in _GEMMA_GGUF_GLOBALS:
        return _GEMMA_GGUF_GLOBALS[name]
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    if part == "post_attention_layernorm":  # Gemma (1): the norm before the MLP; Gemma 2 and 3: after attention
        return f"blk.{layer}.{'ffn_norm' if architecture == 'gemma' else 'post_attention_norm'}.{kind}"
    return f"blk.{layer}.{_GEMMA_GGUF_PARTS[part]}.{kind}"


def write_gemma_gguf(folder, path, architecture: str, qtype=None) -> None:
    """The HF Gemma model in `folder` as llama.cpp's converter writes it: its names, every norm stored as 1 + weight,
    the head tied (no output tensor), soft-caps and the window as metadata; matrices in `qtype` (None: float32)."""
    from gguf import GGUFWriter
    from gguf.quants import quantize

    from tests.models.test_gguf_loader import add_shape_metadata, finish_gguf

    reference = load_reference(folder)
    config = reference.config
    writer = GGUFWriter(str(path), architecture)
    add_shape_metadata(writer, config)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    rope = config.rope_parameters
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"] if "full_attention" in rope else rope["rope_theta"])
    if architecture != "gemma":
        writer.add_sliding_window(config.sliding_window)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None) is not None:
            writer.add_float32(f"{architecture}.{key}", getattr(config, key))
    for name, tensor in reference.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the embedding
        values = tensor.float().numpy()
        if name.endswith("norm.weight"):
            values = values + 1
        if qtype is None or values.ndim == 1:
            writer.add_tensor(_gemma_gguf_name(name, architecture), values)
        else:
            raw = quantize(values, qtype)
            writer.add_tensor(_gemma_gguf_name(name, architecture), raw, raw_shape=raw.shape, raw_dtype=qtype)
    finish_gguf(writer)


@pytest.mark.parametrize(("folder_fixture", "architecture"), [("gemma_folder", "gemma"), ("model_folder", "gemma2"),
                                                               ("gemma3_folder", "gemma3")])
def test_a_gemma_gguf_as_llama_cpp_writes_it_matches_transformers(request, tmp_path, folder_fixture, architecture):
    folder = request.getfixturevalue(folder_fixture)
    write_gemma_gguf(folder, tmp_path / "model.gguf", architecture)
    assert_prompt_logits_match(tmp_path / "model.gguf", load_reference(folder), make_prompts(VOCAB))


def test_a_quantized_gemma2_gguf_runs_in_its_blocks_like_its_float_copy(model_folder, tmp_path):
    from gguf import GGMLQuantizationType

    from ember.engine.sampling_params import SamplingParams
    from ember.llm import LLM
    from ember.quant.ggml.layers import GGMLLinear

    path = tmp_path / "q8.gguf"
    write_gemma_gguf(model_folder, path, "gemma2", GGMLQuantizationType.Q8_0)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = make_prompts(VOCAB)[1]
    in_blocks = LLM(str(path), dtype="auto", quant_activations="float32")
    assert any(isinstance(m, GGMLLinear) for m in in_blocks.engine.runner.model.modules())
    floats = LLM(str(path), dtype="float32")
    assert in_blocks.generate([prompt], params)[0].outputs[0].token_ids == floats.generate([prompt], params)[0].outputs[0].token_ids


def test_gemma_gguf_metadata_reads_as_llama_cpp_reads_it():
    """Gemma 2's even layers slide, Gemma 3's five of six (its sliding ones at base 10,000); queries scale by head_dim,
    by hidden / heads in the 27B models (llama.cpp's rule: their files do not say)."""
    from ember.config.model import ModelConfig
    from ember.models.family_registry import config_from_gguf

    def read(arch: str, num_layers: int) -> ModelConfig:
        metadata = {"general.architecture": arch, f"{arch}.block_count": num_layers, f"{arch}.embedding_length": 4608,
                    f"{arch}.attention.head_count": 32, f"{arch}.attention.key_length": 128, f"{arch}.feed_forward_length": 64,
                    f"{arch}.attention.sliding_window": 4096, f"{arch}.vocab_size": 256}
        return config_from_gguf(metadata, tensor_names=frozenset())

    gemma2, gemma3, big = read("gemma2", 4), read("gemma3", 7), read("gemma2", 46)
    assert gemma2.architecture == "gemma2" and gemma2.layer_windows == (4096, None, 4096, None)
    assert gemma3.architecture == "gemma3_text" and gemma3.layer_windows == (4096,) * 5 + (None, 4096)
    assert gemma3.qk_norm and gemma3.local_rope_theta == 10_000.0 and gemma2.local_rope_theta is None
    assert (gemma2.query_pre_attn_scalar, big.query_pre_attn_scalar) == (128.0, 144.0)
    assert read("gemma", 2).layer_windows is None and read("gemma", 2).hidden_act == "gelu_pytorch_tanh"
