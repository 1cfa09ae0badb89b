"""OPT (pre-norm as OPT-125m, post-norm with a narrower embedding as OPT-350m) against transformers."""

from __future__ import annotations

import json

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

VOCAB = 272


def _opt(**overrides) -> transformers.OPTConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=128, bos_token_id=2, eos_token_id=None, pad_token_id=1)  # fmt: skip
    return transformers.OPTConfig(**{**settings, **overrides})


@pytest.mark.parametrize("overrides", [{}, {"do_layer_norm_before": False, "word_embed_proj_dim": 32}, {"enable_bias": False}],
                         ids=["pre-norm", "post-norm-narrow-embedding", "no-bias"])  # fmt: skip
def test_prompt_logits_and_greedy_generation_match_transformers(tmp_path, overrides):
    assert_random_model_matches(transformers.OPTForCausalLM, _opt(**overrides), tmp_path, VOCAB)


def test_a_bare_decoder_checkpoint_loads_as_the_causal_lm(tmp_path):
    """facebook/opt-* checkpoints hold the bare OPTModel: tensors named decoder.* (the head tied to its embedding)."""
    folder = save_random_model(transformers.OPTForCausalLM, _opt(), tmp_path)
    reference = load_reference(folder)
    state = load_file(folder / "model.safetensors")
    save_file({name.removeprefix("model."): tensor for name, tensor in state.items() if name != "lm_head.weight"},
              folder / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    assert all(name.startswith("decoder.") for name in load_file(folder / "model.safetensors"))
    assert json.loads((folder / "config.json").read_text())["model_type"] == "opt"
    assert_prompt_logits_match(folder, reference, make_prompts(VOCAB))
