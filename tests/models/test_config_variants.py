"""Config variants real checkpoints carry, against transformers: activations, which biases a family reads,
which layers slide, and transformers' defaults for keys a config.json leaves out.

Each case saves a tiny random model with transformers, optionally drops keys from its config.json (as
save_pretrained drops a base-config key equal to the family's default, or an older writer never wrote), and
compares ember's prompt logits with transformers' reading of the same folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from ember.models.family_registry import config_from_hf
from ember.models.llama import LlamaMLP
from tests.model_factory import save_tiny_model
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

CASES = {  # name: (family, overrides, keys dropped from config.json)
    "llama-gelu": ("llama", {"hidden_act": "gelu"}, ()),
    "qwen2-relu": ("qwen2", {"hidden_act": "relu"}, ()),
    "gemma2-exact-gelu": ("gemma2", {"hidden_activation": "gelu"}, ()),
    "qwen2-attention-bias-unread": ("qwen2", {"attention_bias": True}, ()),
    "mistral-mlp-bias-unread": ("mistral", {"mlp_bias": True}, ()),
    "smollm3-window-off-no-layer-types": ("smollm3", {"use_sliding_window": False, "sliding_window": 8}, ("layer_types",)),
    "smollm3-tied-by-default": ("smollm3", {"tie_word_embeddings": True}, ("tie_word_embeddings",)),
    "phi3-eps-default": ("phi3", {"rms_norm_eps": 1e-5}, ("rms_norm_eps",)),
    "granite-attention-multiplier-default": ("granite", {"attention_multiplier": 1.0}, ("attention_multiplier",)),
    "gemma2-defaults": ("gemma2", {"query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
                        ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")),
}  # fmt: skip


def _drop_keys(folder: Path, keys: tuple[str, ...]) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key in keys:
        config.pop(key)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_logits_match_transformers(case: str, tmp_path: Path) -> None:
    family, overrides, dropped = CASES[case]
    folder = save_tiny_model(family, tmp_path, **overrides)
    _drop_keys(folder, dropped)
    assert_prompt_logits_match(folder, load_reference(folder), make_prompts(320))


def test_gemma3_sliding_layers_take_their_own_rope_scaling_and_no_attention_soft_cap(tmp_path: Path) -> None:
    config = transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=5.0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 20_000.0},
                         "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5_000.0}},
        eos_token_id=None,
    )  # fmt: skip
    folder = save_random_model(transformers.Gemma3ForCausalLM, config, tmp_path)
    assert_prompt_logits_match(folder, load_reference(folder), make_prompts(256))


def _config(model_type: str, **fields) -> dict:
    return {"model_type": model_type, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, **fields}  # fmt: skip


def test_windowed_layers_follow_each_familys_rule() -> None:
    # Qwen3-MoE's attention windows every layer (max_window_layers unread); Qwen2-MoE every other one below it.
    assert config_from_hf(_config("qwen3_moe", use_sliding_window=True, sliding_window=8, max_window_layers=2,
                                       num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)).layer_windows == (8,) * 4
    qwen2_moe = _config("qwen2_moe", use_sliding_window=True, sliding_window=8, max_window_layers=3, num_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=16)
    assert config_from_hf(qwen2_moe).layer_windows == (8, None, 8, None)
    # Phi-3 and Mixtral window every layer whatever layer_types says; Qwen2 follows it.
    types = ["full_attention", "sliding_attention"] * 2
    assert config_from_hf(_config("phi3", sliding_window=8, layer_types=types)).layer_windows == (8,) * 4
    assert config_from_hf(_config("qwen2", use_sliding_window=True, sliding_window=8, layer_types=types)).layer_windows == (None, 8) * 2


def test_an_activation_ember_cannot_run_is_refused_by_name() -> None:
    config = config_from_hf(_config("llama", hidden_act="mish"))
    with pytest.raises(ValueError, match="llama activation 'mish' is not supported"):
        LlamaMLP(config)
    with pytest.raises(ValueError, match="experts run silu"):
        config_from_hf(_config("mixtral", hidden_act="gelu", num_local_experts=4, num_experts_per_tok=2))
