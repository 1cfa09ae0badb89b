"""The engine's device: the config and flags that choose it, the CPU path through the device-agnostic runner, and the
decode graphs' padding and bucket choice run eagerly on a CPU (capturing needs a GPU: scripts/gpu-check.sh)."""

from __future__ import annotations

import argparse

import pytest
import torch

from ember.engine.builder import gpu_kv_cache_bytes, step_activation_bytes
from ember.engine.config import CacheConfig, EngineConfig, add_engine_arguments
from ember.engine.cuda_graphs import GraphSettings, capture_sizes, padded_size
from ember.engine.device import DeviceConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.runner import ModelRunner
from ember.engine.sampling_params import SamplingParams
from ember.layers.sampler import Sampler
from ember.llm import LLM
from tests.engine.stories import STORY_PROMPTS, run_to_completion, stories_llm

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
NUM_KV_BLOCKS = 64
BLOCK_SIZE = 16


def _requests(llm) -> dict[str, tuple[list[int], SamplingParams]]:
    return {str(i): (llm.tokenizer.encode(text, add_special_tokens=True), GREEDY) for i, text in enumerate(STORY_PROMPTS)}


def test_device_cpu_asked_for_by_name_gives_the_default_engines_tokens_with_every_tensor_on_the_cpu(stories_dir):
    default = stories_llm(stories_dir, block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS)
    on_cpu = stories_llm(stories_dir, block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS, device="cpu")
    expected = run_to_completion(default, _requests(default))
    got = run_to_completion(on_cpu, _requests(on_cpu))
    assert {k: v.outputs[0].token_ids for k, v in got.items()} == {k: v.outputs[0].token_ids for k, v in expected.items()}
    runner = on_cpu.engine.runner
    assert runner.device == torch.device("cpu") and runner.graphs is None
    assert {cache.device.type for cache in runner.caches.tensors} == {"cpu"}
    assert {parameter.device.type for parameter in runner.model.parameters()} == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_device_cuda_without_a_gpu_is_refused_at_config_time_saying_what_to_run_instead():
    with pytest.raises(ValueError, match=r"device 'cuda' was asked for, but torch .* sees no CUDA device; run with --device cpu"):
        EngineConfig(model="m", device=DeviceConfig("cuda"))


def test_device_config_names_the_flag_of_a_bad_value():
    with pytest.raises(ValueError, match=r"device 'tpu' is not supported; choose one of auto, cpu, cuda \(--device\)"):
        DeviceConfig("tpu")
    for utilization in (0.0, 1.5, True):
        with pytest.raises(ValueError, match="--gpu-memory-utilization"):
            DeviceConfig("cpu", gpu_memory_utilization=utilization)
    assert DeviceConfig("auto").resolved() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert DeviceConfig().load_dtype("auto", torch.device("cuda")) == "bfloat16"
    assert DeviceConfig().load_dtype("auto", torch.device("cpu")) == "auto"
    assert DeviceConfig().load_dtype("float32", torch.device("cuda")) == "float32"


def test_device_flags_reach_the_engine_config():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    config = EngineConfig.from_args(parser.parse_args(["--model", "m", "--device", "cpu", "--gpu-memory-utilization", "0.5",
                                                       "--enforce-eager"]))
    assert config.device == DeviceConfig("cpu", 0.5, enforce_eager=True)
    assert EngineConfig.from_args(parser.parse_args(["--model", "m"])).device == DeviceConfig()


def test_a_cuda_engine_refuses_what_runs_on_a_cpu_only_naming_the_flag():
    EngineConfig(model="m").check_runs_on_cuda()  # nothing CPU-only asked for
    with pytest.raises(ValueError, match="--quantization int8 runs on a CPU engine only so far; drop it or run with --device cpu"):
        EngineConfig(model="m", quantization="int8").check_runs_on_cuda()
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8 runs on a CPU engine only so far"):
        EngineConfig(model="m", cache=CacheConfig(kv_cache_dtype="fp8")).check_runs_on_cuda()


def test_capture_sizes_climb_1_2_4_then_by_8_and_end_at_max_num_seqs():
    assert capture_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(3) == (1, 2, 3)
    assert capture_sizes(1) == (1,)


def test_a_decode_batch_pads_to_the_smallest_captured_size_that_holds_it_and_none_past_the_largest():
    sizes = capture_sizes(64)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 63, 64, 65)] == [1, 2, 4, 8, 8, 16, 24, 64, 64, None]


def test_gpu_kv_budget_is_the_utilized_share_less_what_is_in_use_and_the_steps_activations():
    gib = 1 << 30
    budget = gpu_kv_cache_bytes(total_bytes=80 * gib, free_bytes=76 * gib, utilization=0.9, activation_bytes=gib)
    assert budget == int(80 * gib * 0.9) - 4 * gib - gib - (512 << 20)
    assert gpu_kv_cache_bytes(total_bytes=80 * gib, free_bytes=4 * gib, utilization=0.5, activation_bytes=0) == 0


def test_step_activation_bound_grows_with_the_step_budget_and_the_sampled_rows(stories_dir):
    config = stories_llm(stories_dir, num_kv_blocks=8).engine.model_config
    one = step_activation_bytes(config, 512, 64, 2)
    assert step_activation_bytes(config, 1024, 64, 2) > one and step_activation_bytes(config, 512, 128, 2) > one


def _decoding_plan(llm, count: int):
    """A scheduler plan in which `count` sequences each decode one token (their prompts computed by earlier steps)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    prompts = [llm.tokenizer.encode(STORY_PROMPTS[i % len(STORY_PROMPTS)] * (1 + i % 3), add_special_tokens=True)
               for i in range(count)]
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", prompt, params))
    for _ in range(4):  # the prompts, then a few decodes
        engine.step()
    plan = engine.scheduler.schedule()
    assert len(plan.scheduled) == count and all(item.num_new_tokens == 1 for item in plan.scheduled)
    return plan


def _graph_runner(llm, settings: GraphSettings) -> ModelRunner:
    """A runner over the engine's model and KV manager whose decode steps go through the decode graphs' static
    buffers, run eagerly; its cache starts as a copy of the engine's (plus the scratch block)."""
    engine = llm.engine
    runner = ModelRunner(engine.runner.model, NUM_KV_BLOCKS, BLOCK_SIZE, engine.kv, Sampler(torch.Generator()),
                         frozenset(), graphs=settings)
    for mine, theirs in zip(runner.caches.tensors, engine.runner.caches.tensors, strict=True):
        mine[:, :NUM_KV_BLOCKS].copy_(theirs)
    return runner


@pytest.mark.parametrize(("count", "sizes", "width", "through_graphs"), [
    (3, (1, 2, 4, 8), 64, True),  # padded to 4
    (5, (1, 2, 4, 8), 64, True),  # padded to 8
    (5, (1, 2, 4), 64, False),  # no size holds 5: eager
    (3, (1, 2, 4, 8), 1, False),  # a table wider than the buffers: eager
])
def test_decode_steps_through_the_graphs_buffers_match_the_plain_runner_and_padding_writes_only_the_scratch_block(
        stories_dir, count, sizes, width, through_graphs):
    llm = stories_llm(stories_dir, block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS)
    plan = _decoding_plan(llm, count)
    runner = _graph_runner(llm, GraphSettings(sizes, width, capture=False))
    tables = [item.block_ids[0] for item in plan.scheduled]
    assert runner.graphs.holds(count, tables) is through_graphs
    expected = llm.engine.runner.hidden_states(plan)
    got = runner.hidden_states(plan)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(runner.caches.tensors, llm.engine.runner.caches.tensors, strict=True):
        torch.testing.assert_close(mine[:, :NUM_KV_BLOCKS], theirs, rtol=1e-5, atol=1e-5)
    scratch_written = any(bool(cache[:, NUM_KV_BLOCKS].any()) for cache in runner.caches.tensors)
    assert scratch_written is (through_graphs and padded_size(count, sizes) > count)


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def tiny_folder(request, tmp_path_factory):
    """A tiny random checkpoint: llama (decode graphs), qwen2 (q/k/v biases), mistral (a sliding window: eager)."""
    from tests.model_factory import save_tiny_model

    overrides = {"sliding_window": 8} if request.param == "mistral" else {}
    return save_tiny_model(request.param, tmp_path_factory.mktemp(request.param), **overrides)


def _tiny_greedy(folder, **options) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(folder), block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS, **options)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, llm.engine.model_config.vocab_size, (n,), generator=generator).tolist() for n in (3, 17, 40)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    return llm, [output.outputs[0].token_ids for output in outputs]


@pytest.mark.cuda
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["decode graphs", "eager"])
def test_a_cuda_engine_in_float32_gives_the_cpu_engines_greedy_tokens(tiny_folder, enforce_eager):
    _, expected = _tiny_greedy(tiny_folder, device="cpu", dtype="float32")
    on_gpu, got = _tiny_greedy(tiny_folder, device="cuda", dtype="float32", enforce_eager=enforce_eager)
    assert got == expected
    runner = on_gpu.engine.runner
    assert {cache.device.type for cache in runner.caches.tensors} == {"cuda"}
    assert {parameter.device.type for parameter in runner.model.parameters()} == {"cuda"}
    has_graphs = not enforce_eager and runner.layout.group_windows == (None,)
    assert (runner.graphs is not None) is has_graphs
    assert runner.graphs is None or set(runner.graphs.graphs) == set(capture_sizes(on_gpu.engine.config.scheduler.max_num_seqs))


@pytest.mark.cuda
def test_a_cuda_engine_defaults_to_bfloat16_sizes_its_cache_from_gpu_memory_and_samples_seeded(tmp_path):
    from tests.model_factory import save_tiny_model

    folder = save_tiny_model("llama", tmp_path)
    llm = LLM(str(folder), device="cuda", gpu_memory_utilization=0.3)
    runner = llm.engine.runner
    assert next(runner.model.parameters()).dtype == torch.bfloat16 and runner.caches.dtype == torch.bfloat16
    _, total_bytes = torch.cuda.mem_get_info()
    assert torch.cuda.memory_allocated() <= 0.3 * total_bytes
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    first, again = (llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids for _ in range(2))
    assert len(first) == 12 and first == again
