"""GGUF loading against the `gguf` package (the reference for (de)quantization) and transformers."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from ember.engine.engine_request import EngineRequest
from ember.gguf_file import GGUFFile
from ember.models.gguf_loader import read_gguf_config, unpermute_rope
from ember.models.loader import load_model
from ember.quant.ggml.blocks import FORMATS
from ember.quant.ggml.kernels import load_kernels
from ember.quant.ggml.layers import GGMLEmbedding, GGMLLinear, GGMLRowPartsLinear
from tests.model_factory import load_reference, save_tiny_model

T = GGMLQuantizationType
NUM_HEADS, NUM_KV_HEADS = 4, 2
# Shapes chosen so every matrix row is a whole number of 256-value super-blocks.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS, vocab_size=256)
_HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_PARTS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",  # phi3 stores these two fused
    "mlp.gate_up_proj": "ffn_up",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


# OLMo 2's norms sit after each branch: llama.cpp names them as Gemma 2's post-branch norms
_ARCHITECTURE_PARTS = {"olmo2": {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}}


def _gguf_name(hf_name: str, architecture: str = "llama") -> str:
    if hf_name in _HF_TO_GGUF:
        return _HF_TO_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{({**_LAYER_PARTS, **_ARCHITECTURE_PARTS.get(architecture, {})})[part]}.{kind}"


def _llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (interleaved rotary pairs), as its converter writes it."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


RANDOM_BLOCK_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS)  # types gguf cannot quantize: random blocks


def _random_k_quant(rows: int, cols: int, qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """Valid raw k-quant (or 4-bit i-quant) blocks: random quants and scales, finite fp16 super-block scales."""
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block_values, block_bytes), dtype=np.uint8)
    small = np.frombuffer(np.float16([0.01, 0.002]).tobytes(), dtype=np.uint8)
    if qtype in (T.Q4_K, T.IQ4_NL, T.IQ4_XS):
        raw[..., 0:4 if qtype == T.Q4_K else 2] = small[: 4 if qtype == T.Q4_K else 2]  # d (and Q4_K's dmin) lead
    elif qtype == T.Q2_K:
        raw[..., 80:84] = small  # d, dmin are the last fields
    elif qtype == T.Q3_K:
        raw[..., 108:110] = small[:2]  # d is the last field
    else:
        raw[..., 208:210] = small[:2]  # d is the last field
        raw[..., 192:208] = raw[..., 192:208] % 64  # int8 scales, kept small
    return raw.reshape(rows, -1)


def add_shape_metadata(writer: GGUFWriter, config) -> None:
    """The block count, widths, head counts, context and (an RMSNorm model's) norm epsilon of a transformers `config`,
    as GGUF metadata."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if getattr(config, "rms_norm_eps", None) is not None:
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)


def finish_gguf(writer: GGUFWriter) -> None:
    """Header, metadata and tensors to the file, then close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_gguf(folder: Path, path: Path, qtype: GGMLQuantizationType, rng: np.random.Generator,
               overrides: dict[str, GGMLQuantizationType] | None = None, rope_freqs: np.ndarray | None = None,
               architecture: str = "llama", extra: Callable[[GGUFWriter], None] | None = None) -> dict[str, np.ndarray]:
    """Write the HF model in `folder` as a GGUF (tensors whose GGUF name ends with a key of `overrides` in that type,
    as a Q4_K_M file mixes them; `rope_freqs`, a Llama 3.1 file's per-pair frequency divisors; `extra` adds a
    family's own metadata and tensors); returns the float32 weights each tensor decodes to (HF layout). Only a "llama"
    "smollm3" or "granite" file has llama.cpp's q/k row order, as its converter writes them."""
    reference = load_reference(folder)
    config = reference.config
    permute = architecture in ("llama", "smollm3", "granite")
    writer = GGUFWriter(str(path), architecture)
    writer.add_key_length(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    add_shape_metadata(writer, config)
    writer.add_rope_freq_base(10000.0)  # save_tiny_model sets rope_theta=10000
    if extra is not None:
        extra(writer)
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    expected = {}
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for hf_name, tensor in reference.state_dict().items():
        values = tensor.float().numpy()
        name = _gguf_name(hf_name, architecture)
        if permute and name.endswith(("attn_q.weight", "attn_k.weight")):
            values = _llama_cpp_permute(values, NUM_HEADS if "attn_q" in name else NUM_KV_HEADS)
        tensor_type = next((t for suffix, t in (overrides or {}).items() if name.endswith(suffix)), qtype)
        if values.ndim == 1 or tensor_type == T.F32:
            writer.add_tensor(name, values)
            decoded = values
        elif tensor_type in RANDOM_BLOCK_TYPES:
            raw = _random_k_quant(*values.shape, tensor_type, rng)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=tensor_type)
            decoded = dequantize(raw, tensor_type)
        else:
            raw = quantize(values, tensor_type)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=tensor_type)
            decoded = dequantize(raw, tensor_type)
        if permute and name.endswith(("attn_q.weight", "attn_k.weight")):
            decoded = unpermute_rope(decoded, NUM_HEADS if "attn_q" in name else NUM_KV_HEADS)
        expected[hf_name] = decoded.reshape(tensor.shape)
    finish_gguf(writer)
    return expected


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("gguf-src"), **SHAPE)


def _weights(model) -> dict[str, torch.Tensor]:
    """The model's state dict plus the dequantized weight of every layer that kept GGML blocks."""
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, (GGMLLinear, GGMLEmbedding)):
            state[f"{name}.weight"] = module.weight_blocks.dequantize()
        elif isinstance(module, GGMLRowPartsLinear):
            state[f"{name}.weight"] = torch.cat([part.weight_blocks.dequantize() for part in module.parts])
    return state


def _loaded_weight(model, hf_name: str) -> torch.Tensor:
    """A checkpoint tensor's value inside ember's model (fused projections sliced back apart)."""
    state = _weights(model)
    if hf_name in state:
        return state[hf_name]
    prefix, part, kind = hf_name.rsplit(".", 2)
    fused_parts = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2), "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    fused, index = fused_parts[part]
    fused_weight = state[f"{prefix}.{fused}.{kind}"]
    config = model.config
    sizes = {
        "qkv_proj": [config.num_heads * config.head_dim, *[config.num_kv_heads * config.head_dim] * 2],
        "gate_up_proj": [config.intermediate_size] * 2,
    }[fused]
    return fused_weight.split(sizes)[index]


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K,
                                   T.IQ4_NL, T.IQ4_XS], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_every_tensor_type_loads_to_what_the_gguf_package_dequantizes(tiny_folder, tmp_path, qtype, dtype):
    expected = write_gguf(tiny_folder, tmp_path / "model.gguf", qtype, np.random.default_rng(0))
    loaded = load_model(tmp_path / "model.gguf", dtype=dtype)
    assert loaded.format == "gguf"
    kept_blocks = {type(m) for m in loaded.model.modules()} & {GGMLLinear, GGMLEmbedding}
    assert bool(kept_blocks) == (dtype == "auto" and (qtype.name in FORMATS or qtype == T.IQ4_NL))  # IQ4_NL as Q8_0
    for hf_name, values in expected.items():
        assert torch.equal(_loaded_weight(loaded.model, hf_name), torch.from_numpy(values).float()), hf_name


def _prompt_logprobs(gguf_path: Path, prompt: list[int]) -> torch.Tensor:
    """ember's logprob of each prompt token after the first, from the GGUF at `gguf_path`."""
    from ember.engine.config import CacheConfig, EngineConfig
    from ember.engine.llm_engine import LLMEngine
    from ember.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(gguf_path), tokenizer=None, cache=CacheConfig(num_kv_blocks=16)))
    engine.add_request(EngineRequest("r", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0)))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    return torch.tensor([outputs[-1].prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])


def _reference_logprobs(folder: Path, prompt: list[int]) -> torch.Tensor:
    """transformers' logprob of each prompt token after the first, from the HF model in `folder`."""
    with torch.no_grad():
        logprobs = torch.log_softmax(load_reference(folder)(torch.tensor([prompt])).logits[0], dim=-1)
    return logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]


def test_f32_gguf_logits_match_transformers(tiny_folder, tmp_path):
    write_gguf(tiny_folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0))
    prompt = list(range(3, 40))
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - _reference_logprobs(tiny_folder, prompt)).abs().max().item() <= 1e-4


def test_a_qwen3_gguf_logits_match_transformers_and_its_blocks_run_as_their_float_copy(tmp_path):
    """Qwen3's per-head q/k norms come from the file (attn_q_norm, attn_k_norm) and its q/k rows in their own order."""
    folder = save_tiny_model("qwen3", tmp_path / "hf", **SHAPE, head_dim=32)  # head_dim apart from hidden / heads
    write_gguf(folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0), architecture="qwen3")
    prompt = list(range(3, 40))
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - _reference_logprobs(folder, prompt)).abs().max().item() <= 1e-4
    write_gguf(folder, tmp_path / "q8.gguf", T.Q8_0, np.random.default_rng(0), architecture="qwen3")
    in_blocks = _greedy_tokens(tmp_path / "q8.gguf", "auto", "float32")  # the layers' Python path over the blocks
    assert len(in_blocks) == 10 and in_blocks == _greedy_tokens(tmp_path / "q8.gguf", "float32", "float32")


def test_a_phi3_gguf_with_fused_projections_and_a_window_matches_transformers_and_runs_in_its_blocks(tmp_path):
    folder = save_tiny_model("phi3", tmp_path / "hf", **SHAPE)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, sliding_window=12)))  # every layer windowed, as Phi-3
    write_gguf(folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0), architecture="phi3")
    prompt = list(range(3, 40))  # 37 tokens: most positions see only the last 12
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - _reference_logprobs(folder, prompt)).abs().max().item() <= 1e-4
    write_gguf(folder, tmp_path / "q8.gguf", T.Q8_0, np.random.default_rng(0), architecture="phi3")
    in_blocks = _greedy_tokens(tmp_path / "q8.gguf", "auto", "float32")  # the fused projections in their blocks
    assert len(in_blocks) == 10 and in_blocks == _greedy_tokens(tmp_path / "q8.gguf", "float32", "float32")


def test_a_smollm3_gguf_leaves_every_fourth_layer_unrotated_as_llama_cpp_and_matches_transformers(tmp_path):
    """llama.cpp fixes SmolLM3's NoPE step at 4 (no key in the file): layer 3 of 4 takes no rotation, as the
    checkpoint's no_rope_layers says."""
    folder = save_tiny_model("smollm3", tmp_path / "hf", **SHAPE, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0])
    write_gguf(folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0), architecture="smollm3")
    assert read_gguf_config(GGUFFile.open(tmp_path / "model.gguf")).nope_layers == (3,)
    prompt = list(range(3, 40))
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - _reference_logprobs(folder, prompt)).abs().max().item() <= 1e-4


def test_a_granite_gguf_reads_its_four_scalars_as_llama_cpp_and_matches_transformers(tmp_path):
    folder = save_tiny_model("granite", tmp_path / "hf", **SHAPE)

    def scalars(writer: GGUFWriter) -> None:
        for key, value in (("embedding_scale", 3.0), ("attention.scale", 0.2), ("residual_scale", 0.3), ("logit_scale", 4.0)):
            writer.add_float32(f"granite.{key}", value)

    write_gguf(folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0), architecture="granite", extra=scalars)
    config = read_gguf_config(GGUFFile.open(tmp_path / "model.gguf"))
    assert (config.embedding_multiplier, config.residual_multiplier, config.logits_scaling) == (3.0, pytest.approx(0.3), 4.0)
    prompt = list(range(3, 40))
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - _reference_logprobs(folder, prompt)).abs().max().item() <= 1e-4


def test_an_olmo2_gguf_with_norms_after_each_branch_matches_transformers(tmp_path):
    folder = save_tiny_model("olmo2", tmp_path / "hf", **SHAPE)
    write_gguf(folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0), architecture="olmo2")
    prompt = list(range(3, 40))
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - _reference_logprobs(folder, prompt)).abs().max().item() <= 1e-4


def _llama3_frequency_factors(head_dim: int, theta: float, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs for Llama 3.1's scaling: 1, `factor`, or the ramp between."""
    factors = []
    for frequency in 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim):
        wavelength = 2 * np.pi / frequency
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors)


def test_a_llama3_gguf_rope_freqs_tensor_scales_rotary_as_transformers_llama3_scaling(tmp_path):
    """Llama 3.1/3.2 GGUFs carry their rope scaling as a `rope_freqs` tensor; logits must match transformers' llama3 rope."""
    scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)
    folder = save_tiny_model("llama", tmp_path / "hf", **SHAPE, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, **scaling})
    head_dim = SHAPE["hidden_size"] // NUM_HEADS
    factors = _llama3_frequency_factors(head_dim, 10000.0, *scaling.values())
    assert factors.min() == 1.0 and factors.max() == 8.0 and ((factors > 1) & (factors < 8)).any()  # every regime present
    write_gguf(folder, tmp_path / "model.gguf", T.F32, np.random.default_rng(0), rope_freqs=factors)
    assert load_model(tmp_path / "model.gguf").model.config.rope_scaling.kind == "frequency_factors"
    prompt = list(range(3, 60))
    theirs = _reference_logprobs(folder, prompt)
    assert (_prompt_logprobs(tmp_path / "model.gguf", prompt) - theirs).abs().max().item() <= 1e-4
    wrong = _llama3_frequency_factors(head_dim, 10000.0, 2.0, 1.0, 4.0, 32)  # positive control: other factors, other logits
    write_gguf(folder, tmp_path / "wrong.gguf", T.F32, np.random.default_rng(0), rope_freqs=wrong)
    assert (_prompt_logprobs(tmp_path / "wrong.gguf", prompt) - theirs).abs().max().item() > 1e-3


def test_an_unsupported_tensor_type_is_named_in_the_error(tiny_folder, tmp_path):
    path = tmp_path / "iq.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(256)
    writer.add_head_count(4)
    writer.add_feed_forward_length(512)
    writer.add_tensor("token_embd.weight", np.zeros((256, 40), dtype=np.uint8), raw_shape=(256, 40), raw_dtype=T.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="token_embd.weight has type Q8_1, which ember cannot load"):
        load_model(path)


def test_a_fused_projection_mixing_k_quants_keeps_each_part_in_its_blocks(tiny_folder, tmp_path):
    expected = write_gguf(tiny_folder, tmp_path / "model.gguf", T.Q4_K, np.random.default_rng(1), {"attn_v.weight": T.Q6_K})
    loaded = load_model(tmp_path / "model.gguf", dtype="auto")
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, GGMLRowPartsLinear)
    assert [plain_name(part.format.name) for part in qkv.parts] == ["Q4_K", "Q4_K", "Q6_K"]
    for hf_name, values in expected.items():
        assert torch.equal(_loaded_weight(loaded.model, hf_name), torch.from_numpy(values).float()), hf_name
    if load_kernels() is None:
        return  # no compiled kernels here: the parts run in torch (checked above through their weights)
    # The compiled decoder layer runs the parts' product (ember_ggml_linear over row parts) with the Python path's bits.
    layer = loaded.model.model.layers[0]
    assert layer.compile_for_cpu()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    product = qkv.compiled_product()
    out = torch.empty(3, qkv.out_features)
    ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3)(product.gemm)(
        x.data_ptr(), product.weight, product.bias, out.data_ptr(), 3, qkv.out_features, 256)
    with torch.inference_mode():
        assert torch.equal(out, qkv(x))


def plain_name(name: str) -> str:
    return name.removesuffix("_X8")


def _greedy_tokens(gguf_path: Path, dtype: str, activations: str) -> list[int]:
    from ember.engine.config import CacheConfig, EngineConfig
    from ember.engine.llm_engine import LLMEngine
    from ember.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(gguf_path), tokenizer=None, dtype=dtype, quant_activations=activations,
                                    cache=CacheConfig(num_kv_blocks=16)))
    engine.add_request(EngineRequest("r", list(range(3, 40)), SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():  # step deltas: each holds the tokens new since the last
            tokens.extend(output.outputs[0].token_ids)
    return tokens


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q6_K, T.IQ4_NL], ids=lambda t: t.name)
def test_a_k_quant_gguf_generates_in_its_blocks_what_its_float_copy_generates(tiny_folder, tmp_path, qtype):
    path = tmp_path / "model.gguf"
    write_gguf(tiny_folder, path, qtype, np.random.default_rng(2))
    in_blocks = _greedy_tokens(path, "auto", "float32")  # float32 activations: the products' bits up to summation order
    assert len(in_blocks) == 10 and in_blocks == _greedy_tokens(path, "float32", "float32")
