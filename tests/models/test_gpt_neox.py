"""GPT-NeoX (Pythia: a quarter of each head rotated, parallel residual) against transformers."""

from __future__ import annotations

import pytest
import transformers
from safetensors.torch import load_file, save_file

from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_greedy_matches,
    assert_prompt_logits_match,
    assert_random_model_matches,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB = 288


def _neox(**overrides) -> transformers.GPTNeoXConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=256, bos_token_id=1, eos_token_id=None)  # fmt: skip
    return transformers.GPTNeoXConfig(**{**settings, **overrides})


@pytest.mark.parametrize("overrides", [{}, {"use_parallel_residual": False, "rotary_pct": 0.5, "attention_bias": False},
                                       {"rotary_pct": 1.0, "tie_word_embeddings": True}],
                         ids=["pythia", "sequential-half-rotary-no-bias", "full-rotary-tied"])  # fmt: skip
def test_prompt_logits_and_greedy_generation_match_transformers(tmp_path, overrides):
    assert_random_model_matches(transformers.GPTNeoXForCausalLM, _neox(**overrides), tmp_path, VOCAB)


def test_the_head_loads_as_pythia_names_it_and_as_transformers_5_does(tmp_path):
    """Pythia checkpoints (and transformers' save) call the head embed_out; transformers 5 names it lm_head in memory."""
    folder = save_random_model(transformers.GPTNeoXForCausalLM, _neox(), tmp_path)
    reference = load_reference(folder)
    state = load_file(folder / "model.safetensors")
    state["lm_head.weight"] = state.pop("embed_out.weight")
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    assert_prompt_logits_match(folder, reference, make_prompts(VOCAB))
