"""HF config.json and GGUF metadata -> `ModelConfig` (ember.config.model): the architecture facts a model file needs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ember.config.model import LatentAttentionConfig, ModelConfig, MoEConfig, RopeScaling, YarnRope

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "smollm3", "granite", "olmo2", "gemma", "gemma2", "gemma3", "qwen2moe", "qwen3moe",
                      "starcoder2", "phi2", "stablelm")
# GGUF architecture -> ember's (transformers') name where they differ; one not listed and not below runs as "llama"
_GGUF_ARCHITECTURE_NAMES = {"gemma3": "gemma3_text", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "phi2": "phi"}
_GGUF_OWN_ARCHITECTURES = ("qwen2", "qwen3", "phi3", "smollm3", "granite", "olmo2", "gemma", "gemma2", "starcoder2", "stablelm")
_GGUF_NOPE_STEP = 4  # llama.cpp's smollm3: every fourth layer takes no rotation (fixed there, no key in the file)
SUPPORTED_HF_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3", "granite", "olmo2", "mixtral", "qwen2_moe",
                      "qwen3_moe", "deepseek_v2", "gpt2", "gemma", "gemma2", "gemma3_text", "gemma3", "falcon", "opt",
                      "gpt_neox", "starcoder2", "phi", "stablelm")
# transformers' Gemma3TextConfig defaults: an image-text Gemma 3 checkpoint's text_config lists only what differs.
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "sliding_window_pattern": 6,
}  # fmt: skip
_GRANITE_SCALARS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")
# Families whose windows apply only with use_sliding_window, and those whose attention windows every layer.
_GATED_WINDOW_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3")
_EVERY_LAYER_WINDOW_TYPES = ("mistral", "mixtral", "phi3", "qwen3_moe")



def config_from_hf(config: dict[str, Any]) -> ModelConfig:
    """From a transformers `config.json` dict of any family in SUPPORTED_HF_TYPES."""
    model_type = config.get("model_type")
    if model_type == "gemma3":  # image-text: ember runs its language model (images are not supported)
        return config_from_hf(_gemma3_language_model(config))
    if model_type not in SUPPORTED_HF_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; ember loads {', '.join(SUPPORTED_HF_TYPES)}"
        )
    if model_type == "gpt2":
        return _gpt2_config(config)
    if model_type == "falcon":
        return _falcon_config(config)
    if model_type == "opt":
        return _opt_config(config)
    if model_type == "gpt_neox":
        return _gpt_neox_config(config)
    if model_type == "stablelm":
        return _stablelm_config(config)
    if model_type == "phi":
        return _phi_config(config)
    if model_type == "starcoder2":
        return _starcoder2_config(config)
    base = _llama_like(config)
    extras = _FAMILY_EXTRAS.get(model_type)
    return replace(base, **extras(config)) if extras else base

def _llama_like(config: dict[str, Any]) -> ModelConfig:
    model_type = config["model_type"]
    num_heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    qkv_bias, output_bias, mlp_bias = _hf_biases(config)
    return ModelConfig(
        architecture=model_type,
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 4096),
        rms_norm_eps=config.get("rms_norm_eps", _RMS_NORM_EPS_DEFAULTS.get(model_type, 1e-6)),
        rope_theta=_hf_rope_theta(config),
        # DeepSeek-V2's YaRN is read by its extras, into the latent attention config.
        rope_scaling=None if model_type == "deepseek_v2" else _hf_rope_scaling(config),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        qkv_bias=qkv_bias,
        output_bias=output_bias,
        mlp_bias=mlp_bias,
        layer_windows=_hf_layer_windows(config),
        hidden_act=config.get("hidden_act") or config.get("hidden_activation") or "silu",
    )

def config_from_gguf(metadata: dict[str, Any], has_output_tensor: bool) -> ModelConfig:
    """From GGUF key-value metadata (`{arch}.block_count` and friends)."""
    arch = metadata["general.architecture"]
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; ember loads {', '.join(GGUF_ARCHITECTURES)}")

    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{name}", default)

    num_heads = key("attention.head_count")
    hidden = key("embedding_length")
    rotated = key("rope.dimension_count")
    # phi3's, phi2's and stablelm's rope.dimension_count is what rotates (Phi-4-mini: 3/4 of each head); elsewhere
    # the head
    partial = arch in ("phi3", "phi2", "stablelm")
    head_dim = key("attention.key_length") or (None if partial else rotated) or hidden // num_heads
    rotary_dim = rotated if partial and rotated and rotated < head_dim else None
    window = key("attention.sliding_window") if arch == "phi3" else None  # Phi-3 windows every layer, as transformers
    vocab = key("vocab_size") or len(metadata["tokenizer.ggml.tokens"])
    scaling = None
    if key("rope.scaling.type") == "linear":
        scaling = RopeScaling(kind="linear", factor=float(key("rope.scaling.factor", 1.0)))
    config = ModelConfig(
        architecture=_GGUF_ARCHITECTURE_NAMES.get(arch, arch if arch in _GGUF_OWN_ARCHITECTURES else "llama"),
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length"),
        num_layers=key("block_count"),
        num_heads=num_heads,
        num_kv_heads=key("attention.head_count_kv") or num_heads,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        max_position_embeddings=key("context_length", 4096),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings=not has_output_tensor,
        qkv_bias=arch in ("qwen2", "qwen2moe"),
        qk_norm=arch in ("qwen3", "qwen3moe"),
        layer_windows=(int(window),) * key("block_count") if window else None,
        nope_layers=tuple(i for i in range(key("block_count")) if (i + 1) % _GGUF_NOPE_STEP == 0) if arch == "smollm3" else (),
    )
    if key("expert_count"):
        config = replace(config, **_gguf_moe_extras(arch, key))
    if arch == "granite":
        config = replace(config, **_gguf_granite_extras(key))
    if arch in ("starcoder2", "phi2", "stablelm"):  # LayerNorms; biases and residual read from the tensors (gguf_loader)
        activation = {"starcoder2": "gelu_pytorch_tanh", "phi2": "gelu_new", "stablelm": "silu"}[arch]
        config = replace(config, layer_norm_eps=float(key("attention.layer_norm_epsilon", 1e-5)), hidden_act=activation)
    return replace(config, **_gguf_gemma_extras(arch, key, hidden // num_heads)) if arch.startswith("gemma") else config


def _hf_rope_theta(config: dict[str, Any]) -> float:
    if "rope_theta" in config:
        return float(config["rope_theta"])
    parameters = config.get("rope_parameters") or {}
    return float(parameters.get("rope_theta", 10000.0))


def _hf_rope_scaling(config: dict[str, Any]) -> RopeScaling | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or None
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(scaling["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    if kind == "longrope":
        return _longrope_scaling(config, scaling)
    raise ValueError(f"rope scaling {kind!r} is not supported; ember handles linear, llama3 and longrope")


def _longrope_scaling(config: dict[str, Any], scaling: dict[str, Any]) -> RopeScaling:
    """Phi-3's LongRoPE; the attention factor, unless given, as its authors set it from the context's growth."""
    original = int(scaling.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
                   or config["max_position_embeddings"])
    factor = float(scaling.get("factor") or config["max_position_embeddings"] / original)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(kind="longrope", original_max_position_embeddings=original, attention_factor=float(attention_factor),
                       frequency_factors=tuple(map(float, scaling["short_factor"])),
                       long_frequency_factors=tuple(map(float, scaling["long_factor"])))


# transformers' defaults where a config.json leaves the key out (save_pretrained leaves out a base-config key such as
# tie_word_embeddings when it equals the family's default).
_TIED_BY_DEFAULT = ("smollm3",)
_RMS_NORM_EPS_DEFAULTS = {"phi3": 1e-5, "mixtral": 1e-5, "olmo2": 1e-5}
_MLP_BIAS_TYPES = ("llama", "granite", "smollm3")  # the families whose MLP reads mlp_bias


def _hf_biases(config: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(q/k/v, o_proj, MLP) biases as each family's transformers class reads them: Qwen2 has q/k/v biases whatever
    the config says (Qwen2-MoE: `qkv_bias`), Mistral, Mixtral and Phi-3 none; others follow attention_bias, and
    mlp_bias where their MLP reads it."""
    model_type = config["model_type"]
    if model_type == "qwen2":
        return True, False, False
    if model_type == "qwen2_moe":
        return bool(config.get("qkv_bias", True)), False, False
    if model_type in ("mistral", "mixtral", "phi3"):
        return False, False, False
    attention = bool(config.get("attention_bias", False))
    return attention, attention, model_type in _MLP_BIAS_TYPES and bool(config.get("mlp_bias", False))


def _hf_layer_windows(config: dict[str, Any]) -> tuple[int | None, ...] | None:
    """Per-layer windows from `sliding_window` and `layer_types` (else each family's transformers rule for them)."""
    window = config.get("sliding_window")
    num_layers = config["num_hidden_layers"]
    model_type = config["model_type"]
    if model_type in _GATED_WINDOW_TYPES and not config.get("use_sliding_window", False):
        window = None
    if not window:
        return None
    layer_types = config.get("layer_types")
    if layer_types is None or model_type in _EVERY_LAYER_WINDOW_TYPES:
        layer_types = _default_layer_types(config, model_type, num_layers)
    windows = tuple(int(window) if kind == "sliding_attention" else None for kind in layer_types)
    return windows if any(w is not None for w in windows) else None


def _default_layer_types(config: dict[str, Any], model_type: str, num_layers: int) -> list[str]:
    """Which layers slide where a config names no `layer_types` (or, for some families, whatever it names), as each
    family's transformers config or attention decides."""
    if model_type in ("qwen2", "qwen3"):
        first = config.get("max_window_layers", num_layers)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if model_type == "qwen2_moe":  # every other layer, below max_window_layers
        last = config.get("max_window_layers", num_layers)
        return ["sliding_attention" if i % 2 == 0 and i < last else "full_attention" for i in range(num_layers)]
    if model_type == "smollm3":  # the NoPE layers
        return ["sliding_attention" if not uses_rope else "full_attention" for uses_rope in _smollm3_rope_layers(config)]
    if model_type == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if model_type == "gemma3_text":  # transformers 4's spelling: every `sliding_window_pattern`-th layer is global
        pattern = config.get("sliding_window_pattern", 6)
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    return ["sliding_attention"] * num_layers  # Mistral, Mixtral, Qwen3-MoE: every layer whatever layer_types says


def _smollm3_rope_layers(config: dict[str, Any]) -> list[bool]:
    """Whether each SmolLM3 layer rotates (`no_rope_layers`: 1 where it does; else every `no_rope_layer_interval`-th
    layer is NoPE)."""
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(config["num_hidden_layers"])]
    return [bool(flag) for flag in flags]


def _mixtral_extras(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "moe": MoEConfig(
            num_experts=config["num_local_experts"],
            num_experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["intermediate_size"],
            normalize_top_k=True,
        )
    }


def _qwen2_moe_extras(config: dict[str, Any]) -> dict[str, Any]:
    """Qwen2-MoE and Qwen3-MoE: sparse every `decoder_sparse_step`-th layer except `mlp_only_layers`; Qwen2-MoE adds a
    sigmoid-gated shared expert, Qwen3-MoE has none and normalizes queries and keys per head."""
    num_layers = config["num_hidden_layers"]
    step = config.get("decoder_sparse_step", 1)
    only_mlp = set(config.get("mlp_only_layers") or [])
    num_experts = config["num_experts"] if "num_experts" in config else config["num_local_experts"]  # hub or transformers 5
    dense = tuple(i for i in range(num_layers) if i in only_mlp or num_experts == 0 or (i + 1) % step)
    shared = config.get("shared_expert_intermediate_size", 0)
    return {
        "moe": MoEConfig(
            num_experts=num_experts,
            num_experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["moe_intermediate_size"],
            normalize_top_k=bool(config.get("norm_topk_prob", False)),
            shared_intermediate_size=shared,
            has_shared_expert_gate=shared > 0,
            dense_layers=dense,
        ),
        "qk_norm": config["model_type"] == "qwen3_moe",
    }


def _deepseek_v2_extras(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("mlp_bias"):
        raise ValueError("DeepSeek-V2 with mlp_bias is not supported; ember's DeepSeek-V2 MLPs and experts have no biases")
    topk_method = config.get("topk_method", "greedy")
    if topk_method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"DeepSeek-V2 topk_method {topk_method!r} is not supported; ember routes greedy or group_limited_greedy")
    is_grouped = topk_method == "group_limited_greedy"
    yarn = _hf_yarn(config)
    first_moe = config.get("first_k_dense_replace", 0)
    moe_every = config.get("moe_layer_freq", 1)
    num_layers = config["num_hidden_layers"]
    dense = tuple(i for i in range(num_layers) if i < first_moe or i % moe_every)
    mla = LatentAttentionConfig(
        kv_lora_rank=config["kv_lora_rank"],
        qk_nope_head_dim=config["qk_nope_head_dim"],
        qk_rope_head_dim=config["qk_rope_head_dim"],
        v_head_dim=config["v_head_dim"],
        q_lora_rank=config.get("q_lora_rank"),
        yarn=yarn,
    )
    return {
        "head_dim": config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
        "qkv_bias": bool(config.get("attention_bias", False)),
        "mla": mla,
        "moe": MoEConfig(
            num_experts=config["n_routed_experts"],
            num_experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["moe_intermediate_size"],
            normalize_top_k=False,  # transformers' greedy router leaves the top-k weights as they are
            routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
            shared_intermediate_size=config["moe_intermediate_size"] * (config.get("n_shared_experts") or 0),
            dense_layers=dense,
            num_expert_groups=config.get("n_group") if is_grouped else None,
            num_selected_groups=config.get("topk_group") if is_grouped else None,
        ),
    }


def _hf_yarn(config: dict[str, Any]) -> YarnRope | None:
    """DeepSeek-V2's rope scaling: none, or YaRN (the only kind its checkpoints use)."""
    parameters = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = parameters.get("rope_type") or parameters.get("type") or "default"
    if kind == "default":
        return None
    if kind != "yarn":
        raise ValueError(f"DeepSeek-V2 rope scaling {kind!r} is not supported; ember runs default rope and YaRN")
    original = parameters.get("original_max_position_embeddings") or config["max_position_embeddings"]
    factor = parameters.get("factor") or config["max_position_embeddings"] / original
    return YarnRope(
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(parameters.get("beta_fast") or 32),
        beta_slow=float(parameters.get("beta_slow") or 1),
        mscale=parameters.get("mscale"),
        mscale_all_dim=parameters.get("mscale_all_dim"),
        attention_factor=parameters.get("attention_factor"),
        truncate=bool(parameters.get("truncate", True)),
    )


def _gemma2_extras(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 1 and 2 (and 3's shared part), with transformers' defaults for what a config leaves out: Gemma 2 soft-caps
    attention at 50 and logits at 30; Gemma 2 and 3 scale queries by 256 ** -0.5, Gemma (1) by head_dim ** -0.5."""
    is_gemma2 = config["model_type"] == "gemma2"
    scalar = 256 if config["model_type"] in ("gemma2", "gemma3_text") else config.get("head_dim", 256)
    return {
        "attn_logit_softcap": config.get("attn_logit_softcapping", 50.0 if is_gemma2 else None),
        "final_logit_softcap": config.get("final_logit_softcapping", 30.0 if is_gemma2 else None),
        "query_pre_attn_scalar": float(config.get("query_pre_attn_scalar") or scalar),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", True)),
        "hidden_act": config.get("hidden_activation") or "gelu_pytorch_tanh",
    }


def _gguf_granite_extras(key: Callable[..., Any]) -> dict[str, Any]:
    """Granite's four scalars as llama.cpp's converter names them (an attention scale of 0 or none: head_dim ** -0.5)."""
    return {
        "embedding_multiplier": float(key("embedding_scale", 1.0)),
        "attention_multiplier": float(key("attention.scale", 0.0)) or None,
        "residual_multiplier": float(key("residual_scale", 1.0)),
        "logits_scaling": float(key("logit_scale", 1.0)),
    }


def _gguf_moe_extras(arch: str, key: Callable[..., Any]) -> dict[str, Any]:
    """A GGUF's routed experts as llama.cpp runs them: softmax routing, the top-k weights renormalized except in
    Qwen2-MoE, whose shared expert a sigmoid gates; a "llama" file with experts is Mixtral. Every layer is sparse here
    (the loader marks the layers whose file holds a plain MLP instead, `dense_layers`)."""
    shared = key("expert_shared_feed_forward_length", 0) if arch == "qwen2moe" else 0
    if key("expert_gating_func", 1) != 1:  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
        raise ValueError(f"this {arch} GGUF routes its experts with gating function {key('expert_gating_func')}; "
                         "ember routes GGUF experts with a softmax only")
    moe = MoEConfig(
        num_experts=key("expert_count"),
        num_experts_per_token=key("expert_used_count"),
        expert_intermediate_size=key("expert_feed_forward_length") or key("feed_forward_length"),
        normalize_top_k=bool(key("expert_weights_norm", arch != "qwen2moe")),
        shared_intermediate_size=shared,
        has_shared_expert_gate=shared > 0,
    )
    return {"moe": moe, **({"architecture": "mixtral"} if arch == "llama" else {})}


def _gguf_gemma_extras(arch: str, key: Callable[..., Any], hidden_per_head: int) -> dict[str, Any]:
    """A Gemma GGUF's settings as llama.cpp reads them: GeGLU, soft-caps where the file names them, Gemma 2's
    every other layer sliding and Gemma 3's five of six (its sliding layers rotating with base 10,000), queries scaled
    by head_dim, except in the 27B models (46 and 62 layers), scaled by hidden / heads."""
    num_layers, head_dim = key("block_count"), key("attention.key_length")
    window = key("attention.sliding_window") if arch != "gemma" else None
    pattern = {"gemma2": 2, "gemma3": key("attention.sliding_window_pattern", 6)}.get(arch)
    is_27b = (arch, num_layers) in (("gemma2", 46), ("gemma3", 62))
    windows = None
    if window and pattern:  # every `pattern`-th layer attends to everything
        windows = tuple(None if (i + 1) % pattern == 0 else int(window) for i in range(num_layers))
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "attn_logit_softcap": key("attn_logit_softcapping"),
        "final_logit_softcap": key("final_logit_softcapping"),
        "query_pre_attn_scalar": float(hidden_per_head if is_27b else head_dim),
        "qk_norm": arch == "gemma3",
        "local_rope_theta": 10_000.0 if arch == "gemma3" else None,
        "layer_windows": windows,
    }


def _gemma3_language_model(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config of an image-text Gemma 3 checkpoint: its `text_config` over transformers' defaults."""
    text = config.get("text_config") or {}
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    return {**_GEMMA3_TEXT_DEFAULTS, **text, "model_type": "gemma3_text", "tie_word_embeddings": tied}


def _gemma3_extras(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3 (text): Gemma 2's model with q/k head norms, no attention soft-capping (transformers' Gemma 3 keeps the
    config's value but never applies it), and a rotary base and scaling per layer type: `rope_parameters`
    {"full_attention": ..., "sliding_attention": ...}."""
    parameters = config.get("rope_parameters") or {}
    full, local = parameters.get("full_attention") or {}, parameters.get("sliding_attention") or {}
    return {  # or, as transformers 4 wrote it: rope_theta and rope_scaling (the global layers'), rope_local_base_freq
        **_gemma2_extras(config),
        "attn_logit_softcap": None,
        "qk_norm": True,
        "rope_theta": float(full.get("rope_theta") or config.get("rope_theta") or 1_000_000.0),
        "rope_scaling": _hf_rope_scaling({"rope_parameters": full} if full else config),
        "local_rope_theta": float(local.get("rope_theta") or config.get("rope_local_base_freq") or 10_000.0),
        "local_rope_scaling": _hf_rope_scaling({"rope_parameters": local}) if local else None,
    }


def _phi3_extras(config: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 is the Llama block (its checkpoint stores q/k/v and gate/up fused, in the packed layers' order); Phi-4-mini
    rotates only the leading `partial_rotary_factor` of each head."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(config.get("partial_rotary_factor") or parameters.get("partial_rotary_factor") or 1.0)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {"rotary_dim": _rotary_dim(head_dim, partial, "partial_rotary_factor")}


_FAMILY_EXTRAS = {
    "qwen3": lambda config: {"qk_norm": True},
    # transformers' Granite defaults every scalar left out to 1 (an attention scale of 1, not head_dim ** -0.5)
    "granite": lambda config: {key: float(config.get(key) or 1.0) for key in _GRANITE_SCALARS},
    "smollm3": lambda config: {"nope_layers": tuple(i for i, rotates in enumerate(_smollm3_rope_layers(config)) if not rotates)},
    "phi3": _phi3_extras,
    "mixtral": _mixtral_extras,
    "qwen2_moe": _qwen2_moe_extras,
    "qwen3_moe": _qwen2_moe_extras,
    "deepseek_v2": _deepseek_v2_extras,
    "gemma": _gemma2_extras,  # no soft-capping or windows in its config: the same reading gives Gemma (1)
    "gemma2": _gemma2_extras,
    "gemma3_text": _gemma3_extras,
}


def _gpt2_config(config: dict[str, Any]) -> ModelConfig:
    if config.get("scale_attn_by_inverse_layer_idx") or not config.get("scale_attn_weights", True):
        raise ValueError("GPT-2 with scale_attn_by_inverse_layer_idx or without scale_attn_weights is not supported")
    if config.get("add_cross_attention"):
        raise ValueError("GPT-2 with cross-attention is an encoder-decoder; ember runs decoder-only GPT-2")
    hidden = config["n_embd"]
    num_heads = config["n_head"]
    return ModelConfig(
        architecture="gpt2",
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config.get("n_inner") or 4 * hidden,
        num_layers=config["n_layer"],
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=hidden // num_heads,
        max_position_embeddings=config.get("n_positions", 1024),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=True,
        output_bias=True,
        mlp_bias=True,
        hidden_act=config.get("activation_function", "gelu_new"),
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
    )


def _opt_config(config: dict[str, Any]) -> ModelConfig:
    """OPT: learned positions, LayerNorm before (or after) each branch, ReLU, biases (`enable_bias`), the token
    embedding `word_embed_proj_dim` wide."""
    if config.get("_remove_final_layer_norm") or not config.get("layer_norm_elementwise_affine", True):
        raise ValueError("OPT without a final LayerNorm or with weightless LayerNorms is not supported")
    hidden = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    bias = bool(config.get("enable_bias", True))
    return ModelConfig(
        architecture="opt",
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["ffn_dim"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=bias,
        hidden_act=config.get("activation_function", "relu"),
        layer_norm_before=bool(config.get("do_layer_norm_before", True)),
        embedding_dim=config.get("word_embed_proj_dim") or hidden,
    )


def _gpt_neox_config(config: dict[str, Any]) -> ModelConfig:
    """GPT-NeoX / Pythia, its rotary settings as transformers 5 writes them (`rope_parameters`) or as older configs
    did (`rotary_pct`, `rotary_emb_base`, `rope_scaling`)."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(parameters.get("partial_rotary_factor") or config.get("rotary_pct") or 0.25)
    theta = float(parameters.get("rope_theta") or config.get("rotary_emb_base") or config.get("rope_theta") or 10_000.0)
    bias = bool(config.get("attention_bias", True))
    return ModelConfig(
        architecture="gpt_neox",
        **_partial_rotary_decoder(config, parameters, partial, "rotary_pct", theta, max_positions=2048),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=True,
        hidden_act=config.get("hidden_act", "gelu"),
        parallel_residual=bool(config.get("use_parallel_residual", True)),
    )


def _starcoder2_config(config: dict[str, Any]) -> ModelConfig:
    """StarCoder2: GQA with rotary (`rope_parameters`, or `rope_theta` as the released configs write it), LayerNorm
    (`norm_epsilon`), biases everywhere or nowhere (`use_bias`), a `sliding_window` on every layer; missing keys take
    Starcoder2Config's defaults."""
    hidden = config.get("hidden_size", 3072)
    num_heads = config.get("num_attention_heads", 24)
    num_layers = config.get("num_hidden_layers", 30)
    bias = bool(config.get("use_bias", True))
    window = config.get("sliding_window")
    rope = config.get("rope_parameters") or {}
    return ModelConfig(
        architecture="starcoder2",
        vocab_size=config.get("vocab_size", 49152),
        hidden_size=hidden,
        intermediate_size=config.get("intermediate_size", 12288),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads", 2),
        head_dim=config.get("head_dim") or hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 4096),
        rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10_000.0),  # the dict's wins, as in transformers
        rope_scaling=_hf_rope_scaling(config),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=bias,
        layer_windows=(int(window),) * num_layers if window else None,
        hidden_act=config.get("hidden_act", "gelu_pytorch_tanh"),
        layer_norm_eps=config.get("norm_epsilon", 1e-5),
    )


def _phi_config(config: dict[str, Any]) -> ModelConfig:
    """Phi (phi-1, phi-1.5, phi-2), its rotary settings as transformers 5 writes them (`rope_parameters`) or as older
    configs did (top-level `partial_rotary_factor`, `rope_theta`, `rope_scaling`); a key inside the dict wins, as in
    transformers. Every linear has a bias; half of each head rotates unless the config says otherwise."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(_first_given(parameters.get("partial_rotary_factor"), config.get("partial_rotary_factor"), 0.5))
    theta = float(_first_given(parameters.get("rope_theta"), config.get("rope_theta"), 10_000.0))
    return ModelConfig(
        architecture="phi",
        **_partial_rotary_decoder(config, parameters, partial, "partial_rotary_factor", theta, max_positions=2048),
        qkv_bias=True,
        qk_norm=bool(config.get("qk_layernorm", False)),
        output_bias=True,
        mlp_bias=True,
        hidden_act=config.get("hidden_act", "gelu_new"),
    )


def _partial_rotary_decoder(config: dict[str, Any], parameters: dict[str, Any], partial: float, partial_key: str,
                            theta: float, max_positions: int, head_dim: int | None = None) -> dict[str, Any]:
    """The ModelConfig fields a LayerNorm decoder with partial rotary reads under transformers' standard names (GPT-NeoX,
    Phi, StableLM): shape, rotation (`parameters`: its rope dict), tying and LayerNorm eps."""
    num_heads = config["num_attention_heads"]
    head_dim = head_dim or config.get("head_dim") or config["hidden_size"] // num_heads
    return {
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "num_layers": config["num_hidden_layers"],
        "num_heads": num_heads,
        "num_kv_heads": config.get("num_key_value_heads") or num_heads,
        "head_dim": head_dim,
        "max_position_embeddings": config.get("max_position_embeddings", max_positions),
        "rope_theta": theta,
        "rope_scaling": _hf_rope_scaling({**config, "rope_scaling": parameters}),
        "rotary_dim": _rotary_dim(head_dim, partial, partial_key),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "layer_norm_eps": config.get("layer_norm_eps", 1e-5),
    }


def _rotary_dim(head_dim: int, partial: float, key: str) -> int | None:
    """The leading dims of each head that rotate (None: all of them); ValueError naming `key` unless an even count."""
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"{key} {partial} rotates {rotary_dim} of {head_dim} dims: an even number is needed")
    return rotary_dim if rotary_dim < head_dim else None


def _first_given(*values: Any) -> Any:
    """The first value that is not None (a config key set to 0 or 0.0 still counts as given)."""
    return next(value for value in values if value is not None)


def _stablelm_config(config: dict[str, Any]) -> ModelConfig:
    """StableLM, its rotary settings as transformers 5 writes them (`rope_parameters`) or as the hub's configs do
    (`rope_theta`, `partial_rotary_factor` and `rope_scaling` beside the rest); a key inside the dict wins, as in
    transformers, and a quarter of each head rotates unless the config says otherwise. A rope type ember cannot
    compute is refused by name (`_hf_rope_scaling`)."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25)))
    theta = float(parameters.get("rope_theta", config.get("rope_theta", 10_000.0)))
    head_dim = config["hidden_size"] // config["num_attention_heads"]  # StableLM derives it; a head_dim key is not read
    return ModelConfig(
        architecture="stablelm",
        **_partial_rotary_decoder(config, parameters, partial, "partial_rotary_factor", theta, max_positions=4096,
                                  head_dim=head_dim),
        qkv_bias=bool(config.get("use_qkv_bias", False)),
        qk_norm=bool(config.get("qk_layernorm", False)),
        hidden_act=config.get("hidden_act", "silu"),
        parallel_residual=bool(config.get("use_parallel_residual", False)),
    )


def _falcon_config(config: dict[str, Any]) -> ModelConfig:
    if config.get("alibi") or config.get("new_decoder_architecture") or not config.get("parallel_attn", True):
        raise ValueError(
            "ember runs Falcon-7B-style models (parallel attention, rotary, multi-query or MHA); "
            "ALiBi, new_decoder_architecture (Falcon-40B) and sequential blocks are not supported"
        )
    if config.get("activation", "gelu") != "gelu":
        raise ValueError(f"Falcon activation {config['activation']!r} is not supported; ember runs gelu")
    hidden = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    bias = bool(config.get("bias", False))
    return ModelConfig(
        architecture="falcon",
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config.get("ffn_hidden_size") or 4 * hidden,
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=1 if config.get("multi_query", True) else num_heads,
        head_dim=hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        rope_theta=_hf_rope_theta(config),
        rope_scaling=_hf_rope_scaling(config),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=bias,
        hidden_act="gelu",
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
    )
