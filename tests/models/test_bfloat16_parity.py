"""bfloat16 per family: ember's logits against transformers in bfloat16 and float32 (the references).

transformers computes a bfloat16 model in bfloat16 throughout; ember's CPU path reads bfloat16
weights (and a bfloat16 KV cache) but sums in float32 (on AVX512-BF16 CPUs its products round
their activations to bfloat16, as transformers does), so its error against the float32 reference
is held to at most twice transformers' own bfloat16 error (plus BF16_SLACK), and its top-1 token
must agree with the float32 reference at least as often as transformers' bfloat16 does, less
AGREEMENT_SLACK. The agreement rates are printed (pytest -s) for the record.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from tests.model_factory import save_tiny_model
from tests.models.family_parity import make_prompts, save_random_model, single_thread_torch  # noqa: F401 (a fixture)
from tests.models.test_deepseek_v2_mla import _deepseek_v2
from tests.models.test_gpt2_and_mqa import _gpt2
from tests.models.test_mixtral_moe import _mixtral

BF16_SLACK = 0.02
AGREEMENT_SLACK = 0.05
PROMPT_LENGTHS = (5, 23, 1, 40)


def _gemma2(folder: Path) -> Path:
    import transformers

    config = transformers.Gemma2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=12,
        query_pre_attn_scalar=16, attn_logit_softcapping=1.0, final_logit_softcapping=2.0, attn_implementation="eager",
    )
    return save_random_model(transformers.Gemma2ForCausalLM, config, folder)


def _gemma(folder: Path) -> Path:
    import transformers

    config = transformers.GemmaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
    return save_random_model(transformers.GemmaForCausalLM, config, folder)


def _gemma3(folder: Path) -> Path:
    import transformers

    config = transformers.Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=12,
                                           query_pre_attn_scalar=16, max_position_embeddings=256)
    return save_random_model(transformers.Gemma3ForCausalLM, config, folder)


BUILDERS = {
    "llama (tied head)": lambda folder: save_tiny_model("llama", folder, tie_word_embeddings=True),
    "qwen2": lambda folder: save_tiny_model("qwen2", folder),
    "qwen3 (q/k norms)": lambda folder: save_tiny_model("qwen3", folder, head_dim=32),
    "phi3 (fused checkpoint)": lambda folder: save_tiny_model("phi3", folder),
    "mistral (sliding window)": lambda folder: save_tiny_model("mistral", folder, sliding_window=8),
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "mixtral": _mixtral,
    "deepseek_v2": _deepseek_v2,
    "gpt2": _gpt2,
}


def _ember_logits(folder: Path, prompts: list[list[int]], dtype: str) -> list[torch.Tensor]:
    engine = LLMEngine(EngineConfig(model=str(folder), dtype=dtype, cache=CacheConfig(block_size=4, num_kv_blocks=128)))
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(max_tokens=1)))
    plan = engine.scheduler.schedule()
    input_ids, positions, metadata = engine.runner._prepare(plan.scheduled)
    with torch.inference_mode():
        hidden = engine.runner.model(input_ids, positions, engine.runner.kv_caches, metadata)
        logits = engine.runner.model.compute_logits(hidden).float()
    return list(logits.split([len(p) for p in prompts]))


@pytest.mark.usefixtures("single_thread_torch")
@pytest.mark.parametrize("family", list(BUILDERS))
def test_bfloat16_logits_are_as_close_to_float32_as_transformers_bfloat16(family, tmp_path):
    import transformers

    folder = BUILDERS[family](tmp_path)
    reference32 = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference16 = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    prompts = make_prompts(reference32.config.vocab_size, PROMPT_LENGTHS)
    ours = torch.cat(_ember_logits(folder, prompts, "bfloat16"))
    with torch.no_grad():
        exact = torch.cat([reference32(torch.tensor([p])).logits[0] for p in prompts])
        theirs = torch.cat([reference16(torch.tensor([p])).logits[0].float() for p in prompts])
    our_error, their_error = (ours - exact).abs().max().item(), (theirs - exact).abs().max().item()
    our_agreement = (ours.argmax(-1) == exact.argmax(-1)).float().mean().item()
    their_agreement = (theirs.argmax(-1) == exact.argmax(-1)).float().mean().item()
    print(f"{family}: max |logit - fp32| ember bf16 {our_error:.4f}, transformers bf16 {their_error:.4f}; "
          f"top-1 agreement with fp32 ember {our_agreement:.3f}, transformers {their_agreement:.3f}")
    assert our_error <= 2 * their_error + BF16_SLACK
    assert our_agreement >= their_agreement - AGREEMENT_SLACK
