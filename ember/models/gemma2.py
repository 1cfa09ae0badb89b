"""Gemma 2: local (sliding) and global layers alternating, logit soft-capping, four norms per block; and Gemma (1).

Differences from Llama, each visible below: embeddings scaled by sqrt(hidden); RMSNorm scales by
(1 + weight); the block norms both the input and the output of attention and of the MLP; the
MLP is GeGLU (tanh GELU); attention scores are scaled by `query_pre_attn_scalar ** -0.5` and
soft-capped, `cap * tanh(score / cap)`, and so are the final logits. Even layers attend within
a sliding window, odd layers to everything (`layer_types` in the config says which).
Gemma (1) is the same model without windows and soft-capping, with a Llama-like block of two norms
(`GemmaDecoderLayer`). Gemma 3 (text) is Gemma 2 without soft-capping, with a (1 + weight) RMSNorm on
every query and key head before the rotation, and its own rotary base on the sliding layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.kv.specs import KVCacheSpec
from ember.layers.activation import gated_activation
from ember.layers.attention import AttentionMetadata, paged_attention
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import HFDefaults, hf_rope_scaling, llama_like_reader
from ember.models.decoder import DecoderForCausalLM, DecoderModel, LayerFactory
from ember.models.family_spec import FamilySpec, GGUFKey, GGUFReading


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in float32; Gemma stores the weight as an offset from one."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def divide_output_(self, scales: torch.Tensor) -> None:
        """Make the norm's output x / scales (per channel), in place: (1 + weight) / scales is the new 1 + weight."""
        with torch.no_grad():
            self.weight.copy_((1.0 + self.weight) / scales - 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class Gemma2Attention(nn.Module):
    """GQA with rotary positions, soft-capped scores, and the window of its layer group."""

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.logit_softcap = config.attn_logit_softcap
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.output_bias)
        self.rotary = rotary
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale, logit_softcap=self.logit_softcap)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class Gemma2MLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x)), gate and up fused (another gate activation if the config's
    `hidden_activation` names one)."""

    packed_modules = {"gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(hidden, 2 * inner, bias=False)
        self.down_proj = Linear(inner, hidden, bias=False)
        self.act_and_mul = gated_activation(config.hidden_act, config.architecture)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class GemmaDecoderLayer(nn.Module):
    """Gemma (1): h = x + attn(norm(x)); out = h + mlp(norm(h)), Gemma's norms, attention and GeGLU."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = Gemma2Attention(config, rotary)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = Gemma2MLP(config)

    def input_norms(self) -> tuple[nn.Module, nn.Module]:
        """The norms whose outputs attention and the MLP read (where AWQ / SmoothQuant fold their input scales)."""
        return self.input_layernorm, self.post_attention_layernorm

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        return h + self.mlp(self.post_attention_layernorm(h))


class Gemma2DecoderLayer(GemmaDecoderLayer):
    """h = x + post_attn_norm(attn(norm(x))); out = h + post_ff_norm(mlp(pre_ff_norm(h)))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def input_norms(self) -> tuple[nn.Module, nn.Module]:
        """Attention reads the input norm, the MLP the pre-feed-forward one (post-attention norms its output)."""
        return self.input_layernorm, self.pre_feedforward_layernorm

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Gemma2Model(DecoderModel):
    """The shared decoder with Gemma's scaled embeddings and (1 + weight) final norm."""

    def __init__(self, config: ModelConfig, make_layer: LayerFactory, specs: list[KVCacheSpec], rotary: RotaryEmbedding) -> None:
        super().__init__(config, make_layer, specs, rotary)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embed_scale = config.hidden_size**0.5

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        h = h * torch.tensor(self.embed_scale, dtype=h.dtype)
        for layer, kv_cache, group in zip(self.layers, kv_caches, self.layer_groups, strict=True):
            h = layer(h, positions, kv_cache, metadata.for_group(group))
        return self.norm(h)


class Gemma2ForCausalLM(DecoderForCausalLM):
    """Gemma 2 (and Gemma) with its LM head tied to the embedding and (Gemma 2) soft-capped final logits."""

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = config
        # Gemma 3's sliding layers rotate with their own base (unscaled); every other layer shares the model's rotary
        self.local_rotary = None if config.local_rope_theta is None else RotaryEmbedding(
            config.head_dim, config.rotary_table_positions, config.local_rope_theta, config.local_rope_scaling)
        self.model = Gemma2Model(config, self.make_layer, self.kv_cache_specs(), self.make_rotary())
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def input_norms(self) -> list[tuple[nn.Module, nn.Module]]:
        """Every block's norm before attention and before the MLP."""
        return [layer.input_norms() for layer in self.model.layers]

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        config = self.config
        if self.local_rotary is not None and config.window_of(layer_index) is not None:
            rotary = self.local_rotary
        block = GemmaDecoderLayer if config.architecture == "gemma" else Gemma2DecoderLayer
        return block(config, rotary)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)


# transformers' Gemma3TextConfig defaults: an image-text Gemma 3 checkpoint's text_config lists only what differs.
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "sliding_window_pattern": 6,
}  # fmt: skip


def _gemma2_fields(config: dict[str, Any]) -> dict[str, Any]:
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


def _gemma3_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3 (text): Gemma 2's model with q/k head norms, no attention soft-capping (transformers' Gemma 3 keeps the
    config's value but never applies it), and a rotary base and scaling per layer type: `rope_parameters`
    {"full_attention": ..., "sliding_attention": ...}."""
    parameters = config.get("rope_parameters") or {}
    full, local = parameters.get("full_attention") or {}, parameters.get("sliding_attention") or {}
    return {  # or, as transformers 4 wrote it: rope_theta and rope_scaling (the global layers'), rope_local_base_freq
        **_gemma2_fields(config),
        "attn_logit_softcap": None,
        "qk_norm": True,
        "rope_theta": float(full.get("rope_theta") or config.get("rope_theta") or 1_000_000.0),
        "rope_scaling": hf_rope_scaling({"rope_parameters": full} if full else config),
        "local_rope_theta": float(local.get("rope_theta") or config.get("rope_local_base_freq") or 10_000.0),
        "local_rope_scaling": hf_rope_scaling({"rope_parameters": local}) if local else None,
    }


def _gemma3_language_model(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config of an image-text Gemma 3 checkpoint: its `text_config` over transformers' defaults."""
    text = config.get("text_config") or {}
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    return {**_GEMMA3_TEXT_DEFAULTS, **text, "model_type": "gemma3_text", "tie_word_embeddings": tied}


def _gemma2_layer_types(config: dict[str, Any], num_layers: int) -> list[str]:
    """Gemma 2's rule: the even layers slide."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]


def _gemma3_layer_types(config: dict[str, Any], num_layers: int) -> list[str]:
    """transformers 4's spelling of Gemma 3's layers: every `sliding_window_pattern`-th layer is global."""
    pattern = config.get("sliding_window_pattern", 6)
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]


_read_gemma3_text = llama_like_reader(HFDefaults(default_layer_types=_gemma3_layer_types), _gemma3_fields)


def _read_gemma3(config: dict[str, Any]) -> ModelConfig:
    """Gemma 3's text model; of an image-text checkpoint ("gemma3"), its language model (images are not supported)."""
    return _read_gemma3_text(_gemma3_language_model(config) if config.get("model_type") == "gemma3" else config)


def _gguf_fields(arch: str, key: GGUFKey) -> dict[str, Any]:
    """A Gemma GGUF's settings as llama.cpp reads them: GeGLU, soft-caps where the file names them, Gemma 2's
    every other layer sliding and Gemma 3's five of six (its sliding layers rotating with base 10,000), queries scaled
    by head_dim, except in the 27B models (46 and 62 layers), scaled by hidden / heads."""
    num_layers, head_dim = key("block_count"), key("attention.key_length")
    hidden_per_head = key("embedding_length") // key("attention.head_count")
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


# Gemma 2 and 3 norm the attention's output and both sides of the MLP (llama.cpp's ffn_norm is the norm before it).
_GGUF_LAYER_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                     "post_ffw_norm": "post_feedforward_layernorm"}
FAMILIES = (
    # Gemma (1): no soft-capping or windows in its config; the same reading gives it
    FamilySpec("gemma", Gemma2ForCausalLM, llama_like_reader(HFDefaults(), _gemma2_fields),
               gguf=GGUFReading(("gemma",), read_fields=lambda key: _gguf_fields("gemma", key), has_unit_offset_norms=True),
               quantize_formats=("safetensors",)),
    FamilySpec("gemma2", Gemma2ForCausalLM, llama_like_reader(HFDefaults(default_layer_types=_gemma2_layer_types), _gemma2_fields),
               gguf=GGUFReading(("gemma2",), read_fields=lambda key: _gguf_fields("gemma2", key), layer_names=_GGUF_LAYER_NAMES,
                                has_unit_offset_norms=True),
               quantize_formats=("safetensors",)),
    FamilySpec("gemma3_text", Gemma2ForCausalLM, _read_gemma3, other_hf_types=("gemma3",),
               gguf=GGUFReading(("gemma3",), read_fields=lambda key: _gguf_fields("gemma3", key), layer_names=_GGUF_LAYER_NAMES,
                                has_unit_offset_norms=True),
               quantize_formats=("safetensors",)),
)
