"""The compiled decoder layer against the layer's Python path (the reference): the same bits.

One flat batch mixes a fresh prompt, a prompt over a cached prefix and decodes, over a shuffled
block pool; Llama, Qwen2 (biases on q/k/v) and Mistral (a sliding window), float32 and
bfloat16 weights, and GGML blocks (quantized products).
"""

from __future__ import annotations

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.layers.cpu_decoder_layer import (
    CompiledDecoderStack,
    FinalNorm,
    load_decoder_layer_kernel,
)
from ember.layers.cpu_prepare import restore_dense_weights
from ember.models.llama import LlamaDecoderLayer
from ember.quant.ggml.kernels import MAX_PASS_ROWS
from ember.quant.ggml.kernels import load_kernels as load_ggml_kernels
from ember.quant.ggml.layers import GGMLLinear, set_activations
from tests.model_factory import save_tiny_model
from tests.quant.ggml_factory import random_blocks

FAMILIES = {"llama": {}, "qwen2": {}, "mistral": {"sliding_window": 6}, "qwen3": {"head_dim": 32}, "phi3": {}}


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if load_decoder_layer_kernel() is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): the kernels are unavailable")


def compiled_layers(engine: LLMEngine) -> list[LlamaDecoderLayer]:
    return [m for m in engine.runner.model.modules() if isinstance(m, LlamaDecoderLayer)]


def run_steps(engine: LLMEngine, steps: int) -> list[torch.Tensor]:
    """Hidden states of `steps` engine steps (prefill chunks, then decodes), stepping the engine on."""
    hidden_states = []
    for _ in range(steps):
        plan = engine.scheduler.schedule()
        input_ids, positions, metadata = engine.runner._prepare(plan.scheduled)
        with torch.inference_mode():
            hidden_states.append(engine.runner.model(input_ids, positions, engine.runner.kv_caches, metadata))
        engine.step()  # the same step again, for real: its K/V replaces what the probe wrote
    return hidden_states


def make_engine(folder, dtype: str) -> LLMEngine:
    config = EngineConfig(model=str(folder), dtype=dtype, cache=CacheConfig(block_size=4, num_kv_blocks=64),
                          scheduler=SchedulerConfig(max_num_batched_tokens=16))  # fmt: skip
    engine = LLMEngine(config)
    prompts = [[5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 11], [4, 4, 1], [7, 3, 9, 12, 2, 5, 5, 1, 9, 3, 3, 8, 2, 7, 1, 6, 4]]
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
    return engine


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_layer_gives_the_python_paths_bits(tmp_path, family, dtype):
    folder = save_tiny_model(family, tmp_path / family, **FAMILIES[family])
    compiled, python = make_engine(folder, dtype), make_engine(folder, dtype)
    assert all(layer.compiled is not None for layer in compiled_layers(compiled))
    for layer in compiled_layers(python):
        layer.drop_compiled()
    for ours, reference in zip(run_steps(compiled, 6), run_steps(python, 6), strict=True):
        assert torch.equal(ours, reference)


def test_a_layer_with_dense_products_stays_on_the_python_path(tmp_path):
    engine = make_engine(save_tiny_model("llama", tmp_path / "llama"), "float32")
    restore_dense_weights(engine.runner.model)
    layers = compiled_layers(engine)
    assert all(layer.compiled is None for layer in layers)
    assert not any(layer.compile_for_cpu() for layer in layers)


def quantize_products(engines: list[LLMEngine]) -> None:
    """The same random GGML blocks (mixed formats, as a Q4_K_M file mixes them) as every layer's products."""
    formats = {"qkv_proj": "Q4_1", "o_proj": "Q8_0", "gate_up_proj": "Q4_0", "down_proj": "Q8_0"}
    for index, layers in enumerate(zip(*(compiled_layers(engine) for engine in engines), strict=True)):
        for name, fmt in formats.items():
            parent = "self_attn" if name in ("qkv_proj", "o_proj") else "mlp"
            dense = getattr(getattr(layers[0], parent), name)
            blocks = random_blocks(fmt, rows=dense.out_features, cols=dense.in_features, seed=index * 10 + len(name))
            for layer in layers:
                setattr(getattr(layer, parent), name, GGMLLinear(blocks))


def test_compiled_layer_with_ggml_products_gives_the_python_paths_bits(tmp_path):
    if load_ggml_kernels() is None:
        pytest.skip("the GGML kernels are unavailable")
    folder = save_tiny_model("llama", tmp_path / "llama")
    compiled, python = make_engine(folder, "float32"), make_engine(folder, "float32")
    quantize_products([compiled, python])
    assert all(layer.compile_for_cpu() for layer in compiled_layers(compiled))
    for layer in compiled_layers(python):
        layer.drop_compiled()
    # Steps of up to 16 rows run in C, as GEMV passes; more rows than a GGML product takes from C go
    # back to the Python path (checked below). Both give the Python path's bits.
    for ours, reference in zip(run_steps(compiled, 6), run_steps(python, 6), strict=True):
        assert torch.equal(ours, reference)
    layer = compiled_layers(compiled)[0]
    rows = MAX_PASS_ROWS + 1
    assert layer.compiled(torch.zeros(rows, 64), torch.zeros(rows, dtype=torch.int64), compiled.runner.kv_caches[0],
                          compiled.runner._prepare(compiled.scheduler.schedule().scheduled)[2]) is None  # fmt: skip


def test_a_change_of_activations_rebuilds_the_compiled_layers(tmp_path):
    if load_ggml_kernels() is None:
        pytest.skip("the GGML kernels are unavailable")
    engine = make_engine(save_tiny_model("llama", tmp_path / "llama"), "float32")
    quantize_products([engine])
    layers = compiled_layers(engine)
    for layer in layers:
        layer.compile_for_cpu()
    before = [layer.compiled for layer in layers]
    assert set_activations(engine.runner.model, "float32") == 2 * 4
    assert all(layer.compiled is not None and layer.compiled is not old for layer, old in zip(layers, before, strict=True))


def test_the_compiled_layers_run_as_one_stack_rebuilt_when_a_layer_changes(tmp_path):
    engine = make_engine(save_tiny_model("llama", tmp_path / "llama"), "float32")
    decoder, layers = engine.runner.model.model, compiled_layers(engine)
    stack = decoder.compiled_stack()
    assert stack is not None and stack.applies_final_norm
    assert stack.matches(tuple(layer.compiled for layer in layers), stack.final_norm)
    assert decoder.compiled_stack() is stack
    layers[1].drop_compiled()
    assert decoder.compiled_stack() is None  # one layer on the Python path: layer by layer
    layers[1].compile_for_cpu()
    rebuilt = decoder.compiled_stack()
    assert rebuilt is not None and rebuilt is not stack and rebuilt.layers[1] is layers[1].compiled
    decoder.norm.weight = torch.nn.Parameter(decoder.norm.weight.detach().clone())  # new memory: the stack must not read the old
    assert decoder.compiled_stack() is not rebuilt and decoder.compiled_stack().final_norm.weight.data_ptr() == decoder.norm.weight.data_ptr()


def test_the_stack_writes_into_whichever_caches_a_step_hands_it(tmp_path):
    engine = make_engine(save_tiny_model("llama", tmp_path / "llama"), "float32")
    engine.step()  # the stack has now pointed its tables at the runner's caches
    plan = engine.scheduler.schedule()
    input_ids, positions, metadata = engine.runner._prepare(plan.scheduled)
    model, caches = engine.runner.model, engine.runner.kv_caches
    copies = [cache.clone() for cache in caches]
    with torch.inference_mode():
        into_copies = model(input_ids, positions, copies, metadata)
        unchanged = [cache.clone() for cache in caches]
        into_runner = model(input_ids, positions, caches, metadata)
    assert torch.equal(into_copies, into_runner)
    assert all(torch.equal(a, b) for a, b in zip(copies, caches, strict=True))  # the same K/V went to each list
    assert not all(torch.equal(a, b) for a, b in zip(unchanged, caches, strict=True))  # and the copies' step left the runner's alone


def test_a_final_norm_of_another_width_is_refused(tmp_path):
    engine = make_engine(save_tiny_model("llama", tmp_path / "llama"), "float32")
    compiled = tuple(layer.compiled for layer in compiled_layers(engine))
    hidden = engine.runner.model.model.norm.weight.shape[0]
    assert CompiledDecoderStack.build(compiled, FinalNorm.of(torch.ones(hidden), 1e-6)).applies_final_norm
    with pytest.raises(ValueError, match="final norm"):
        CompiledDecoderStack.build(compiled, FinalNorm.of(torch.ones(hidden + 1), 1e-6))
