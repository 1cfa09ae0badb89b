"""AutoGPTQ / AutoAWQ checkpoints (written by tests/quant/gptq_awq_factory.py from the format rules) load into
ember's quantized layers: weights equal the reference dequantization exactly, logits and greedy tokens match
transformers running those float weights, and layouts ember cannot run are refused with the fix named."""

from __future__ import annotations

import ctypes
import json
import logging
from pathlib import Path

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from ember.models.loader import load_model
from ember.quant.ggml.kernels import load_kernels
from ember.quant.ggml.layers import GGMLLinear, ZeroPointLinear
from ember.quant.hf.gptq_awq import HFQuantization
from tests.model_factory import load_reference, save_tiny_model
from tests.quant.gptq_awq_factory import Variant, write_checkpoint

LOGIT_TOLERANCE = 1e-4  # float32 logits against transformers on the dequantized weights
PROMPTS = [[5, 9, 200, 17, 3], list(range(30, 53)), [7], list(range(100, 140))]
NUM_GENERATED = 16
FUSED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj"),
         "self_attn.o_proj": ("o_proj",), "mlp.down_proj": ("down_proj",)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-quant-src")
    return {family: save_tiny_model(family, root / family) for family in ("llama", "qwen2")}


def _expected(reference: dict[str, torch.Tensor], layer: int, fused: str) -> torch.Tensor:
    prefix = f"model.layers.{layer}.{fused.rpartition('.')[0]}"
    return torch.cat([reference[f"{prefix}.{part}.weight"] for part in FUSED[fused]])


@pytest.mark.parametrize(("variant", "layer_class"), [
    (Variant(sym=True), GGMLLinear),  # the common AutoGPTQ checkpoint: plain Q4_0 blocks, compiled decoder layer
    (Variant(sym=False, act_order=True), ZeroPointLinear),
    (Variant(sym=False, group_size=-1, checkpoint_format="gptq_v2"), ZeroPointLinear),
    (Variant(bits=8, sym=True, act_order=True), ZeroPointLinear),
    (Variant(bits=8, sym=False, group_size=64), ZeroPointLinear),
    (Variant(method="awq"), ZeroPointLinear),
], ids=["gptq4-sym", "gptq4-actorder", "gptq4-v2-rows", "gptq8-sym-actorder", "gptq8-g64", "awq4"])
def test_quantized_weights_equal_the_reference_dequantization_exactly(sources, tmp_path, variant, layer_class):
    reference = write_checkpoint(sources["llama"], tmp_path / "q", variant)
    model = load_model(tmp_path / "q").model
    for layer in range(2):
        for fused in FUSED:
            module = model.get_submodule(f"model.layers.{layer}.{fused}")
            assert type(module) is layer_class
            held = module.weight_tensor if isinstance(module, ZeroPointLinear) else module.weight_blocks
            assert torch.equal(held.dequantize(), _expected(reference, layer, fused)), fused
        assert (model.model.layers[layer].compiled is not None) == (load_kernels() is not None)  # one compiled call per layer
    as_float = load_model(tmp_path / "q", dtype="float32").model.state_dict()
    assert torch.equal(as_float["model.layers.1.mlp.gate_up_proj.weight"], _expected(reference, 1, "mlp.gate_up_proj"))


@pytest.mark.parametrize("variant", [Variant(sym=False, act_order=True), Variant(method="awq")], ids=["gptq4-actorder", "awq4"])
def test_few_and_many_row_products_equal_x_times_the_dequantized_weight(sources, tmp_path, variant):
    reference = write_checkpoint(sources["llama"], tmp_path / "q", variant)
    layer = load_model(tmp_path / "q").model.model.layers[0].mlp.gate_up_proj
    layer.activations = "float32"
    weight = _expected(reference, 0, "mlp.gate_up_proj")
    x = torch.randn(60, weight.shape[1], generator=torch.Generator().manual_seed(0))
    for rows in (1, 5, 60):  # the compiled call (up to MAX_PASS_ROWS rows), then torch around dequantized tiles
        torch.testing.assert_close(layer(x[:rows]), x[:rows] @ weight.t(), rtol=1e-5, atol=1e-5)
    compiled = layer.compiled_product()
    if compiled is not None:  # the decoder layer's product pointer: the same bits as forward
        y = torch.empty(5, weight.shape[0])
        ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3)(compiled.gemm)(
            x.data_ptr(), compiled.weight, compiled.bias, y.data_ptr(), 5, weight.shape[0], weight.shape[1])
        assert torch.equal(y, layer(x[:5]))


@pytest.mark.parametrize(("variant", "warning"), [
    (Variant(group_size=16), "do not cover whole 32-value blocks"),
    (Variant(act_order=True, shared_order=False), ""),  # q, k, v in different column orders cannot fuse in blocks
], ids=["groups-of-16", "unshared-act-order"])
def test_weights_blocks_cannot_hold_load_as_exact_float32(sources, tmp_path, caplog, variant, warning):
    reference = write_checkpoint(sources["llama"], tmp_path / "q", variant)
    with caplog.at_level(logging.WARNING, logger="ember.quant.codes.grouped"):
        model = load_model(tmp_path / "q").model
    assert warning in caplog.text
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert not isinstance(qkv, GGMLLinear)
    weight = qkv.packed.dense() if qkv.packed is not None else qkv.weight
    assert torch.equal(weight, _expected(reference, 0, "self_attn.qkv_proj"))


def _prompt_logits(folder: Path) -> list[torch.Tensor]:
    engine = LLMEngine(EngineConfig(model=str(folder), quant_activations="float32", cache=CacheConfig(block_size=4, num_kv_blocks=256)))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(max_tokens=1)))
    plan = engine.scheduler.schedule()
    input_ids, positions, metadata = engine.runner._prepare(plan.scheduled)
    with torch.inference_mode():
        logits = engine.runner.model.compute_logits(engine.runner.model(input_ids, positions, engine.runner.kv_caches, metadata))
    return list(logits.split([len(p) for p in PROMPTS]))


@pytest.mark.parametrize(("family", "variant"), [
    ("llama", Variant(sym=True)),  # plain Q4_0 blocks: the compiled decoder layer
    ("llama", Variant(sym=False, act_order=True)),
    ("qwen2", Variant(method="awq")),  # qwen2: float biases beside the quantized q, k, v
], ids=["gptq4-sym-llama", "gptq4-actorder-llama", "awq4-qwen2"])
def test_logits_and_greedy_tokens_match_transformers_on_the_dequantized_weights(sources, tmp_path, family, variant):
    weights = write_checkpoint(sources[family], tmp_path / "q", variant)
    reference = load_reference(sources[family])
    reference.load_state_dict(weights)
    for prompt, logits in zip(PROMPTS, _prompt_logits(tmp_path / "q"), strict=True):
        with torch.no_grad():
            expected = reference(torch.tensor([prompt])).logits[0]
        assert (logits - expected).abs().max().item() <= LOGIT_TOLERANCE
    llm = LLM(str(tmp_path / "q"), quant_activations="float32", block_size=4, num_kv_blocks=256)
    params = SamplingParams(temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        assert output.outputs[0].token_ids == _reference_greedy(reference, prompt)


def _reference_greedy(reference, prompt: list[int]) -> list[int]:
    """Argmax decoding with transformers' forward (its generate() bans EOS under min_new_tokens; ember's ignore_eos does not)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(NUM_GENERATED):
            tokens.append(int(reference(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


@pytest.mark.parametrize(("config", "fix"), [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "ember quantize --method gptq"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "format='gptq'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "is_marlin_format": True}, "format='gptq'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "pack_dtype": "int16"}, "pack_dtype=torch.int32"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"-:.*down": {}}}, "one setting for every module"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "exllama"}, "version='GEMM'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version='GEMM'"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"}, "ember quantize --method awq"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "positive integer or -1"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "load a float checkpoint"),
])
def test_layouts_ember_cannot_run_are_refused_naming_the_fix(config, fix):
    with pytest.raises(ValueError, match=fix.replace("(", r"\(").replace(".", r"\.")):
        HFQuantization.from_config(config)


def test_an_unreadable_layout_fails_at_load_before_any_weight_is_read(sources, tmp_path):
    write_checkpoint(sources["llama"], tmp_path / "q", Variant())
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPTQ bits 3"):
        load_model(tmp_path / "q")


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v2"])
def test_expert_and_latent_attention_checkpoints_match_transformers_on_the_dequantized_weights(family, tmp_path):
    """Each expert's linears are quantized on their own; MLA's kv_b_proj, whose weight the absorbed decode reads as a
    matrix, loads dequantized (exact) while its neighbours stay in blocks."""
    from safetensors.torch import save_file

    source = save_tiny_model(family, tmp_path / "float")
    weights = write_checkpoint(source, tmp_path / "q", Variant(sym=True))
    (tmp_path / "reference").mkdir()  # transformers 5 fuses experts at load: it reads the float weights from a checkpoint
    (tmp_path / "reference" / "config.json").write_text((source / "config.json").read_text())
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(tmp_path / "reference" / "model.safetensors"))
    reference = load_reference(tmp_path / "reference")
    for prompt, logits in zip(PROMPTS, _prompt_logits(tmp_path / "q"), strict=True):
        with torch.no_grad():
            expected = reference(torch.tensor([prompt])).logits[0]
        assert (logits - expected).abs().max().item() <= LOGIT_TOLERANCE
    layers = load_model(tmp_path / "q", "auto").model.model.layers
    assert isinstance(layers[1].mlp.experts[0].down_proj if family == "deepseek_v2" else layers[1].block_sparse_moe.experts[0].w2,
                      GGMLLinear)
    if family == "deepseek_v2":
        assert layers[0].self_attn.kv_b_proj.weight.dtype == torch.float32
        assert isinstance(layers[0].self_attn.o_proj, GGMLLinear)
