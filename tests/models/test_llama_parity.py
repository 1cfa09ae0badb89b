"""Parity with transformers (the reference) for the Llama family: logits to 1e-4 and greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.model_factory import load_reference, save_tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "phi3", "smollm3", "granite", "olmo2"]  # qwen3: q/k head norms, head_dim
# apart from hidden / heads; phi3: q/k/v and gate/up stored fused in the checkpoint; smollm3: a layer without rotary
# positions (NoPE); granite: scaled embeddings, attention, residual branches and logits; olmo2: norms after each branch
PROMPT_LENGTHS = [5, 17, 40, 3, 33, 64, 1, 9]
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, save_tiny_model(request.param, folder)


@pytest.fixture(scope="module")
def reference_greedy(family_model) -> list[list[int]]:
    """transformers' greedy continuation (32 tokens) of each prompt, computed once per family."""
    _, folder = family_model
    reference = load_reference(folder)
    expected = []
    for prompt in _prompts(reference.config.vocab_size):
        out = reference.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
        expected.append(out[0, len(prompt) :].tolist())
    return expected


def _prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def _ember_batch_logits(folder: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits of every prompt position, all prompts in one flat batch (one forward pass)."""
    engine = LLMEngine(EngineConfig(model=str(folder), cache=CacheConfig(block_size=4, num_kv_blocks=256)))
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(max_tokens=1)))
    plan = engine.scheduler.schedule()
    assert len(plan.scheduled) == len(prompts)
    input_ids, positions, metadata = engine.runner._prepare(plan.scheduled)
    with torch.inference_mode():
        hidden = engine.runner.model(input_ids, positions, engine.runner.kv_caches, metadata)
        logits = engine.runner.model.compute_logits(hidden)
    return list(logits.split(PROMPT_LENGTHS))


def test_prompt_logits_match_transformers_in_a_mixed_batch(family_model):
    family, folder = family_model
    reference = load_reference(folder)
    prompts = _prompts(reference.config.vocab_size)
    ours = _ember_batch_logits(folder, prompts)
    for prompt, logits in zip(prompts, ours, strict=True):
        with torch.no_grad():
            expected = reference(torch.tensor([prompt])).logits[0]
        assert (logits - expected).abs().max().item() <= LOGIT_TOLERANCE, family


@pytest.mark.parametrize("budget", [2048, 7], ids=["whole-prompts", "chunked-prefill"])
def test_greedy_generation_matches_transformers_alone_and_batched(family_model, reference_greedy, budget):
    _, folder = family_model
    expected = reference_greedy
    prompts = _prompts(320)
    llm = LLM(str(folder), block_size=4, num_kv_blocks=400, max_num_batched_tokens=budget)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    alone = llm.generate([prompts[2]], params)[0].outputs[0].token_ids
    batched = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    assert alone == expected[2]
    assert batched == expected
    assert llm.engine.kv.num_free_blocks == 400


def test_decode_logits_over_a_long_context_match_transformers(family_model):
    """Decode steps past several attention spans (a decoding sequence's keys are read in spans of
    128 tokens, merged after): each step's logits against transformers over the same tokens."""
    _, folder = family_model
    reference = load_reference(folder)
    prompt = torch.randint(0, 320, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    llm = LLM(str(folder), block_size=4, num_kv_blocks=400)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    completion = llm.generate([prompt], params)[0].outputs[0]
    tokens = prompt + completion.token_ids
    with torch.no_grad():
        expected = torch.log_softmax(reference(torch.tensor([tokens])).logits[0, len(prompt) - 1 : -1], dim=-1)
    assert completion.token_ids == expected.argmax(-1).tolist()
    for step, (token, logprobs) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        assert abs(logprobs[token].logprob - expected[step, token].item()) <= LOGIT_TOLERANCE, step
