"""The Llama family (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) over a paged KV cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.activation import SILU_NAMES, gated_activation
from ember.layers.attention import AttentionMetadata, paged_attention
from ember.layers.cpu_decoder_layer import CompiledDecoderLayer, LayerShape, LayerWeights
from ember.layers.cpu_gemm import CompiledProductSource
from ember.layers.linear import Linear
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding, UnrotatedEmbedding
from ember.models.config_reading import (
    HFDefaults,
    attention_and_mlp_biases,
    llama_like_reader,
    no_biases,
    rotary_dim,
)
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import QUANTIZE_FORMATS, FamilySpec, GGUFKey, GGUFReading

GGUF_NOPE_STEP = 4  # llama.cpp's smollm3: every fourth layer takes no rotation (fixed there, no key in the file)
GRANITE_SCALARS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary positions; K/V live in the layer's cache.

    Q, K and V come from one fused projection (`qkv_proj`, packed from the checkpoint's
    q_proj / k_proj / v_proj at load): one matrix product instead of three. With `qk_norm` (Qwen3)
    every query and key head is RMS-normed over head_dim (`q_norm`, `k_norm`) before the rotation.
    """

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.attention_multiplier or config.head_dim**-0.5
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        hidden = config.hidden_size
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(self.q_size, hidden, bias=config.output_bias)
        self.rotary = rotary
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads = self.qkv_proj(x).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            self._norm_heads(heads)
        # Queries and keys are adjacent heads of the fused output: one rotation, in place, covers both.
        self.rotary.rotate_(positions, heads[:, : self.num_heads + self.num_kv_heads])
        q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def _norm_heads(self, heads: torch.Tensor) -> None:
        """q_norm over every query head and k_norm over every key head of heads [tokens, heads, head_dim], in place."""
        queries, keys = heads[:, : self.num_heads], heads[:, self.num_heads : self.num_heads + self.num_kv_heads]
        queries.copy_(self.q_norm(queries.reshape(-1, self.head_dim)).view_as(queries))
        keys.copy_(self.k_norm(keys.reshape(-1, self.head_dim)).view_as(keys))


class LlamaMLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)), gate and up in one fused product; act is SiLU (SwiGLU) unless
    the config's `hidden_act` names another."""

    packed_modules = {"gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(hidden, 2 * inner, bias=config.mlp_bias)
        self.down_proj = Linear(inner, hidden, bias=config.mlp_bias)
        self.is_swiglu = config.hidden_act in SILU_NAMES  # the compiled decoder layer runs SwiGLU only
        self.act_and_mul = gated_activation(config.hidden_act, config.architecture)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + mlp(norm(h)).

    On the CPU, once its products have compiled forms, the block runs as one compiled call
    (`compile_for_cpu`); the Python code below stays the reference and the fallback.
    """

    compiled: CompiledDecoderLayer | None = None

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.residual_multiplier = config.residual_multiplier  # Granite's; the compiled block adds outputs unscaled

    def input_norms(self) -> tuple[nn.Module, nn.Module]:
        """The norms whose outputs attention and the MLP read (where AWQ / SmoothQuant fold their input scales)."""
        return self.input_layernorm, self.post_attention_layernorm

    def compile_for_cpu(self) -> bool:
        """Hand the forward to one compiled call where every product has a compiled form (see `CompiledProduct`)."""
        attention, mlp = self.self_attn, self.mlp
        modules = (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)
        products = [module.compiled_product() if isinstance(module, CompiledProductSource) else None for module in modules]
        norms = (self.input_layernorm, self.post_attention_layernorm, attention.q_norm, attention.k_norm)
        if None in products or not mlp.is_swiglu or self.residual_multiplier != 1.0 or len({norm.eps for norm in norms if norm is not None}) != 1:  # the kernel takes one eps
            return False
        q_norm, k_norm = (None, None) if attention.q_norm is None else (attention.q_norm.weight.detach(), attention.k_norm.weight.detach())
        weights = LayerWeights(
            self.input_layernorm.weight.detach(), self.post_attention_layernorm.weight.detach(),
            *products, attention.rotary.cos, attention.rotary.sin, q_norm, k_norm,
        )
        shape = LayerShape(
            attention.num_heads, attention.num_kv_heads, attention.head_dim, attention.scale, self.input_layernorm.eps
        )
        self.compiled = CompiledDecoderLayer.build(weights, shape)
        return self.compiled is not None

    def drop_compiled(self) -> bool:
        was_compiled, self.compiled = self.compiled is not None, None
        return was_compiled

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        if self.compiled is not None:
            out = self.compiled(x, positions, kv_cache, metadata)
            if out is not None:
                return out
        attended = self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        scale = self.residual_multiplier
        normed, h = self.post_attention_layernorm.add_and_norm(x, attended if scale == 1.0 else attended * scale)
        mixed = self.mlp(normed)
        return h + (mixed if scale == 1.0 else mixed * scale)


class LlamaForCausalLM(DecoderForCausalLM):
    """The Llama family: Llama blocks over the config's per-layer KV specs.

    Full attention for Llama, Qwen2, Qwen3 and SmolLM2; a sliding window on every layer for Mistral,
    and on Qwen2's and Qwen3's layers past `max_window_layers` (hybrid local/global).
    """

    _unrotated_tables: UnrotatedEmbedding | None = None  # built by the first NoPE layer (SmolLM3's)

    def input_norms(self) -> list[tuple[nn.Module, nn.Module]]:
        """Every block's norm before attention and before the MLP."""
        return [layer.input_norms() for layer in self.model.layers]

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        if layer_index in self.config.nope_layers:
            rotary = self._unrotated()
        return LlamaDecoderLayer(self.config, rotary)

    def _unrotated(self) -> UnrotatedEmbedding:
        """The one position-free rotation every NoPE layer shares."""
        if self._unrotated_tables is None:
            self._unrotated_tables = UnrotatedEmbedding(self.config.head_dim, self.config.rotary_table_positions)
        return self._unrotated_tables


def qwen2_biases(config: dict[str, Any]) -> tuple[bool, bool, bool]:
    """Qwen2 has q/k/v biases whatever its config says, and no others."""
    return True, False, False


def _slides_from_max_window_layers(config: dict[str, Any], num_layers: int) -> list[str]:
    """Qwen2's and Qwen3's rule: the layers from `max_window_layers` on slide."""
    first = config.get("max_window_layers", num_layers)
    return ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]


def _smollm3_rope_layers(config: dict[str, Any]) -> list[bool]:
    """Whether each SmolLM3 layer rotates (`no_rope_layers`: 1 where it does; else every `no_rope_layer_interval`-th
    layer is NoPE)."""
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(config["num_hidden_layers"])]
    return [bool(flag) for flag in flags]


def _smollm3_slides_off_rope(config: dict[str, Any], num_layers: int) -> list[str]:
    """SmolLM3's rule: the NoPE layers slide."""
    return ["sliding_attention" if not uses_rope else "full_attention" for uses_rope in _smollm3_rope_layers(config)]


def _phi3_extras(config: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 is the Llama block (its checkpoint stores q/k/v and gate/up fused, in the packed layers' order); Phi-4-mini
    rotates only the leading `partial_rotary_factor` of each head."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(config.get("partial_rotary_factor") or parameters.get("partial_rotary_factor") or 1.0)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {"rotary_dim": rotary_dim(head_dim, partial, "partial_rotary_factor")}


def _gguf_phi3_window(key: GGUFKey) -> dict[str, Any]:
    """Phi-3 windows every layer, as transformers does."""
    window = key("attention.sliding_window")
    return {"layer_windows": (int(window),) * key("block_count") if window else None}


def _gguf_smollm3_nope(key: GGUFKey) -> dict[str, Any]:
    return {"nope_layers": tuple(i for i in range(key("block_count")) if (i + 1) % GGUF_NOPE_STEP == 0)}


def _gguf_granite_scalars(key: GGUFKey) -> dict[str, Any]:
    """Granite's four scalars as llama.cpp's converter names them (an attention scale of 0 or none: head_dim ** -0.5)."""
    return {
        "embedding_multiplier": float(key("embedding_scale", 1.0)),
        "attention_multiplier": float(key("attention.scale", 0.0)) or None,
        "residual_multiplier": float(key("residual_scale", 1.0)),
        "logits_scaling": float(key("logit_scale", 1.0)),
    }


def _smollm3_nope_layers(config: dict[str, Any]) -> dict[str, Any]:
    return {"nope_layers": tuple(i for i, rotates in enumerate(_smollm3_rope_layers(config)) if not rotates)}


def _granite_scalars(config: dict[str, Any]) -> dict[str, Any]:
    """transformers' Granite defaults every scalar left out to 1 (an attention scale of 1, not head_dim ** -0.5)."""
    return {key: float(config.get(key) or 1.0) for key in GRANITE_SCALARS}


def _llama_block(architecture: str, read_hf: Callable[[dict[str, Any]], ModelConfig], gguf: GGUFReading | None,
                 is_tensor_parallel: bool) -> FamilySpec:
    """An architecture the Llama block runs: `ember quantize` writes both checkpoint formats of it back."""
    return FamilySpec(architecture, LlamaForCausalLM, read_hf, gguf=gguf, is_tensor_parallel=is_tensor_parallel,
                      quantize_formats=QUANTIZE_FORMATS)


_QWEN_WINDOWS = HFDefaults(windows_need_flag=True, default_layer_types=_slides_from_max_window_layers)
FAMILIES = (
    _llama_block("llama", llama_like_reader(HFDefaults(biases=attention_and_mlp_biases)),
                 GGUFReading(("llama", "mistral"), is_rope_interleaved=True), is_tensor_parallel=True),
    _llama_block("qwen2", llama_like_reader(replace(_QWEN_WINDOWS, biases=qwen2_biases)),
                 GGUFReading(("qwen2",), read_fields=lambda key: {"qkv_bias": True}), is_tensor_parallel=True),
    _llama_block("qwen3", llama_like_reader(_QWEN_WINDOWS, lambda config: {"qk_norm": True}),
                 GGUFReading(("qwen3",), read_fields=lambda key: {"qk_norm": True}), is_tensor_parallel=True),
    _llama_block("mistral", llama_like_reader(HFDefaults(biases=no_biases, ignores_layer_types=True)),
                 None, is_tensor_parallel=True),  # its GGUFs run as llama
    _llama_block("phi3", llama_like_reader(HFDefaults(biases=no_biases, rms_norm_eps=1e-5, ignores_layer_types=True),
                                           _phi3_extras),
                 GGUFReading(("phi3",), read_fields=_gguf_phi3_window, rotates_part_of_head=True,
                             layer_names={"ffn_up": "mlp.gate_up_proj"}),  # its ffn_up holds gate and up, gate first
                 is_tensor_parallel=False),
    _llama_block("smollm3", llama_like_reader(HFDefaults(biases=attention_and_mlp_biases, is_tied=True, windows_need_flag=True,
                                                         default_layer_types=_smollm3_slides_off_rope), _smollm3_nope_layers),
                 GGUFReading(("smollm3",), read_fields=_gguf_smollm3_nope, is_rope_interleaved=True), is_tensor_parallel=True),
    _llama_block("granite", llama_like_reader(HFDefaults(biases=attention_and_mlp_biases), _granite_scalars),
                 GGUFReading(("granite",), read_fields=_gguf_granite_scalars, is_rope_interleaved=True),
                 is_tensor_parallel=False),
)
