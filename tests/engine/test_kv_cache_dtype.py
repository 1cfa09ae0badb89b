"""The KV cache dtype (`kv_cache_dtype`, `--kv-cache-dtype`): blocks a budget buys, and fp8's numbers.

On a tiny random Llama: an fp8 (e4m3) cache gives 4x float32's blocks in the same bytes; its
logits stay within a bound of the float32 cache's that follows from e4m3's rounding (see
`test_fp8_cache_logits_stay_within_sixteen_bfloat16_roundings`); the compiled decoder layer and
the plain-torch path read the same fp8 cache to the same values.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.model_factory import save_tiny_model

# 2 layers x (K, V) x 16 tokens x 2 KV heads x 16 dims: elements in one block of TINY_SHAPE's cache
TINY_BLOCK_ELEMENTS = 2 * 2 * 16 * 2 * 16


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("kv_dtype") / "llama")


def test_an_unknown_cache_dtype_is_refused_naming_the_choices(tiny_llama):
    with pytest.raises(ValueError, match=r"kv_cache_dtype 'int4' is not supported; choose one of auto, float32, bfloat16, fp8"):
        CacheConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="choose one of auto"):
        LLM(str(tiny_llama), kv_cache_dtype="float64")


@pytest.mark.parametrize(("kv_cache_dtype", "element_bytes", "torch_dtype"), [
    ("auto", 4, torch.float32), ("bfloat16", 2, torch.bfloat16), ("fp8", 1, torch.float8_e4m3fn), ("fp8_e5m2", 1, torch.float8_e5m2),
])  # fmt: skip
def test_a_narrower_cache_holds_more_blocks_in_the_same_memory(tiny_llama, kv_cache_dtype, element_bytes, torch_dtype):
    budget = 1 << 20
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), cache=CacheConfig(kv_cache_memory_bytes=budget, kv_cache_dtype=kv_cache_dtype)))
    stats = engine.stats()
    assert stats.num_total_blocks == budget // (TINY_BLOCK_ELEMENTS * element_bytes)  # 128, 256, 512
    assert stats.kv_cache_bytes == budget
    assert {cache.dtype for cache in engine.runner.kv_caches} == {torch_dtype}


def prompt_logits(folder, kv_cache_dtype: str, prompts: list[list[int]]) -> torch.Tensor:
    """Logits of every prompt token, prompts prefilled in chunks of 16 over block-size-4 tables, so
    every chunk after the first reads the earlier ones back from the cache."""
    config = EngineConfig(model=str(folder), cache=CacheConfig(block_size=4, num_kv_blocks=64, kv_cache_dtype=kv_cache_dtype),
                          scheduler=SchedulerConfig(max_num_batched_tokens=16))  # fmt: skip
    engine = LLMEngine(config)
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(temperature=0, max_tokens=1)))
    logits = []
    while engine.has_unfinished_requests():
        plan = engine.scheduler.schedule()
        logits.append(engine.runner.all_logits(plan))
        engine.step()  # the same step for real: it writes the same K/V again and moves on
    return torch.cat(logits)


PROMPTS = [[(7 * i + 3) % 320 for i in range(37)], [5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 11]]


def test_fp8_cache_logits_stay_within_sixteen_bfloat16_roundings(tiny_llama):
    """e4m3 keeps 3 mantissa bits, bfloat16 7: each cached value's rounding error is 2^4 = 16 times
    bfloat16's, and to first order the logits move linearly with it. So the fp8 cache's distance to
    the float32 cache's logits is bounded by 16x the bfloat16 cache's distance; 32x leaves a factor
    2 for the subnormals (|x| < 2^-6 rounds to steps of 2^-9, not relative ones). It must also be
    larger than bfloat16's: the cache really holds 8-bit values."""
    reference = prompt_logits(tiny_llama, "auto", PROMPTS)
    bf16_error = (prompt_logits(tiny_llama, "bfloat16", PROMPTS) - reference).abs().max().item()
    fp8_error = (prompt_logits(tiny_llama, "fp8", PROMPTS) - reference).abs().max().item()
    assert 0 < bf16_error < fp8_error <= 32 * bf16_error
    e5m2_error = (prompt_logits(tiny_llama, "fp8_e5m2", PROMPTS) - reference).abs().max().item()
    assert fp8_error < e5m2_error <= 64 * bf16_error  # 2 mantissa bits: twice e4m3's steps, a subnormal range far below

def without_fused_attention(metadata):
    """The same step's metadata with no `paged` batch: layers fall back to their torch attention."""
    others = tuple(dataclasses.replace(group, paged=None) for group in metadata.other_groups)
    return dataclasses.replace(metadata, paged=None, other_groups=others)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_the_compiled_layer_and_the_torch_path_read_an_fp8_cache_alike(tiny_llama, kv_cache_dtype):
    """Chunked prefill, prefill over a cached prefix and decodes: the fused C read of the e4m3 (e5m2) cache and
    torch's (float8 widened by `.float()`) give the same hidden states up to summation order."""
    config = EngineConfig(model=str(tiny_llama), cache=CacheConfig(block_size=4, num_kv_blocks=64, kv_cache_dtype=kv_cache_dtype),
                          scheduler=SchedulerConfig(max_num_batched_tokens=16))  # fmt: skip
    engine = LLMEngine(config)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)))
    steps = 0
    while engine.has_unfinished_requests():
        plan = engine.scheduler.schedule()
        input_ids, positions, metadata = engine.runner._prepare(plan.scheduled)
        with torch.inference_mode():
            fused = engine.runner.model(input_ids, positions, engine.runner.kv_caches, metadata)
            plain = engine.runner.model(input_ids, positions, engine.runner.kv_caches, without_fused_attention(metadata))
        assert torch.allclose(fused, plain, rtol=1e-5, atol=1e-5)
        engine.step()
        steps += 1
    assert steps >= 7  # 48 prompt tokens in chunks of 16, then decodes


def test_every_cache_dtype_the_config_takes_has_a_torch_dtype():
    from ember.engine.config import KV_CACHE_DTYPES
    from ember.kv.tensors import KV_CACHE_TORCH_DTYPES

    assert set(KV_CACHE_DTYPES) == {"auto", *KV_CACHE_TORCH_DTYPES}
