"""Shared parity checks against transformers (the reference) for ember's model families.

Each family test builds a tiny random model with transformers, saves it as safetensors, and
asserts: prompt logits in float32 within LOGIT_TOLERANCE of transformers (all prompts in one
mixed flat batch, some with a cached prefix), and greedy generation identical to
`generate(do_sample=False)` alone and in a mixed batch with chunked prefill forced.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.device import DeviceConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM

LOGIT_TOLERANCE = 1e-4
PROMPT_LENGTHS = (5, 23, 1, 40)
NUM_GENERATED = 48
BLOCK_SIZE = 4
NUM_BLOCKS = 400


@pytest.fixture
def single_thread_torch() -> Iterator[None]:
    """Tiny models gain nothing from threads, and on a busy machine extra threads only contend."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def save_random_model(model_class, config, folder: Path, seed: int = 0) -> Path:
    """A transformers model of `config` with spread-out random weights, saved in `folder`."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():  # make the random weights less uniform so logits (and routes) spread out
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def load_reference(folder: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def make_prompts(vocab_size: int, lengths: tuple[int, ...] = PROMPT_LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def ember_prompt_logits(folder: Path, prompts: list[list[int]], max_model_len: int | None = None) -> list[torch.Tensor]:
    """Logits of every prompt position, all prompts in one flat batch (one forward pass of the runner, on the CPU
    through the device-agnostic path a GPU engine takes)."""
    cache = CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=256)
    engine = LLMEngine(EngineConfig(model=str(folder), cache=cache, max_model_len=max_model_len, device=DeviceConfig("cpu")))
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(max_tokens=1)))
    plan = engine.scheduler.schedule()
    assert len(plan.scheduled) == len(prompts)
    logits = engine.runner.all_logits(plan)
    return list(logits.split([len(p) for p in prompts]))


def assert_prompt_logits_match(folder: Path, reference, prompts: list[list[int]], max_model_len: int | None = None) -> None:
    ours = ember_prompt_logits(folder, prompts, max_model_len)
    for prompt, logits in zip(prompts, ours, strict=True):
        with torch.no_grad():
            expected = reference(torch.tensor([prompt])).logits[0]
        difference = (logits - expected).abs().max().item()
        assert difference <= LOGIT_TOLERANCE, f"prompt of {len(prompt)} tokens: max abs diff {difference}"


def reference_greedy(reference, prompt: list[int], num_tokens: int = NUM_GENERATED) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():  # the mask says every token is real: generate() would read its pad id (0) in the prompt as padding
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens, min_new_tokens=num_tokens,
                                 do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def assert_greedy_matches(folder: Path, reference, prompts: list[list[int]], budget: int = 7) -> LLM:
    """Greedy tokens equal transformers' alone and batched (chunked prefill: `budget` tokens a step)."""
    expected = [reference_greedy(reference, prompt) for prompt in prompts]
    llm = LLM(str(folder), block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS, max_num_batched_tokens=budget)
    params = SamplingParams(temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True)
    alone = llm.generate([prompts[1]], params)[0].outputs[0].token_ids
    assert alone == expected[1]
    batched = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    for i, (ours, theirs) in enumerate(zip(batched, expected, strict=True)):
        assert ours == theirs, f"prompt {i}: first difference at token {_first_difference(ours, theirs)}"
    assert llm.engine.kv.num_free_blocks == NUM_BLOCKS
    return llm


def assert_random_model_matches(model_class, config, folder: Path, vocab_size: int) -> LLM:
    """A random `model_class(config)` saved in `folder`: its prompt logits and greedy generation equal transformers'
    (`assert_prompt_logits_match`, `assert_greedy_matches`); the engine that generated, for more checks."""
    save_random_model(model_class, config, folder)
    reference = load_reference(folder)
    prompts = make_prompts(vocab_size)
    assert_prompt_logits_match(folder, reference, prompts)
    return assert_greedy_matches(folder, reference, prompts)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
