"""The KV planner: bytes per token and per sequence, how many sequences fit a budget, formula vs reality.

The formula is the seed's `2 * L * n_kv * d_h * bytes` per token (keys and values of every
layer), `L * (kv_lora_rank + qk_rope_head_dim) * bytes` for MLA, and a windowed layer keeps at
most its window. "Fit" counts paged blocks: a sequence holds whole blocks, one block id costs
`KVCacheLayout.bytes_per_block` (layer groups share block ids, see `ember.kv.specs`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ember.config.model import LatentAttentionConfig, ModelConfig
from ember.kv.specs import KVCacheLayout, kv_specs_for

ELEMENT_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}

# Shapes of well-known models (transformers config.json fields), for planning without a download.
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "llama-2-7b": dict(
        model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
    ),
    "llama-2-13b": dict(
        model_type="llama", vocab_size=32000, hidden_size=5120, intermediate_size=13824,
        num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096,
    ),
    "llama-3-8b": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    ),
    "mistral-7b-v0.1": dict(
        model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        sliding_window=4096,
    ),
    "deepseek-v2-lite": dict(
        model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=163840,
        kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, moe_intermediate_size=1408,
        first_k_dense_replace=1, routed_scaling_factor=1.0,
    ),
}


def equivalent_mha_bytes_per_token(config: ModelConfig, element_size: int) -> int:
    """Per-token KV bytes of the same model with full multi-head attention (every head its own K and V)."""
    if config.mla is not None:
        mla = config.mla
        per_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim
        return config.num_layers * config.num_heads * per_head * element_size
    return 2 * config.num_layers * config.num_heads * config.head_dim * element_size


def attention_kind(config: ModelConfig) -> str:
    """MHA, GQA-n (n KV heads), MQA or MLA, with the window noted."""
    if config.mla is not None:
        kind = "MLA"
    elif config.num_kv_heads == config.num_heads:
        kind = "MHA"
    elif config.num_kv_heads == 1:
        kind = "MQA"
    else:
        kind = f"GQA-{config.num_kv_heads}"
    windows = {w for w in (config.layer_windows or ()) if w is not None}
    if windows:
        num_windowed = sum(1 for w in config.layer_windows or () if w is not None)
        kind += f" + window {max(windows)} on {num_windowed}/{config.num_layers} layers"
    return kind


@dataclass(frozen=True)
class KVPlan:
    """What the KV cache of one model costs, and what a budget buys."""

    name: str
    attention: str
    dtype: str
    context_tokens: int
    bytes_per_token: int  # the formula, every layer, no window
    bytes_per_sequence: int  # one sequence of context_tokens, windows applied
    mha_bytes_per_token: int  # the same model with full multi-head attention
    memory_bytes: int | None = None
    num_sequences: int | None = None  # sequences of context_tokens that fit, in whole blocks
    allocated_bytes_per_token: int | None = None  # what the engine really allocated (loaded models)

    @property
    def ratio_to_mha(self) -> float:
        return self.mha_bytes_per_token / self.bytes_per_token


def plan(
    name: str,
    config: ModelConfig,
    dtype: str,
    context_tokens: int,
    memory_bytes: int | None = None,
    block_size: int = 16,
    allocated_bytes_per_token: int | None = None,
) -> KVPlan:
    """The KV plan of `config` at `context_tokens` in `dtype` under an optional memory budget."""
    if dtype not in ELEMENT_SIZES:
        raise ValueError(f"dtype {dtype!r} is not known; choose one of {', '.join(ELEMENT_SIZES)}")
    if context_tokens < 1:
        raise ValueError("the context length must be at least 1 token")
    element = ELEMENT_SIZES[dtype]
    layout = KVCacheLayout.from_specs(kv_specs_for(config))
    num_sequences = None
    if memory_bytes is not None:
        num_blocks = memory_bytes // layout.bytes_per_block(block_size, element)
        num_sequences = num_blocks // blocks_per_sequence(layout, context_tokens, block_size)
    return KVPlan(
        name=name,
        attention=attention_kind(config),
        dtype=dtype,
        context_tokens=context_tokens,
        bytes_per_token=layout.bytes_per_token(element),
        bytes_per_sequence=layout.bytes_per_sequence(context_tokens, element),
        mha_bytes_per_token=equivalent_mha_bytes_per_token(config, element),
        memory_bytes=memory_bytes,
        num_sequences=num_sequences,
        allocated_bytes_per_token=allocated_bytes_per_token,
    )


def blocks_per_sequence(layout: KVCacheLayout, context_tokens: int, block_size: int) -> int:
    """Block ids one decoding sequence of `context_tokens` holds over all layer groups."""
    full = -(-context_tokens // block_size)
    total = 0
    for window in layout.group_windows:
        total += full if window is None else min(full, -(-window // block_size) + 1)
    return total


def compare_variants(base: ModelConfig, kv_lora_rank: int = 512, rope_head_dim: int = 64) -> list[tuple[str, ModelConfig]]:
    """MHA, GQA-8, MQA and MLA variants of one model size (layers, heads, head dim kept)."""
    mla = LatentAttentionConfig(
        kv_lora_rank=kv_lora_rank,
        qk_nope_head_dim=base.head_dim,
        qk_rope_head_dim=rope_head_dim,
        v_head_dim=base.head_dim,
    )
    return [
        ("MHA", replace(base, num_kv_heads=base.num_heads, layer_windows=None, mla=None)),
        ("GQA-8", replace(base, num_kv_heads=8, layer_windows=None, mla=None)),
        ("MQA", replace(base, num_kv_heads=1, layer_windows=None, mla=None)),
        ("MLA", replace(base, num_kv_heads=base.num_heads, layer_windows=None, mla=mla)),
    ]


def format_bytes(count: float) -> str:
    """Decimal units (the seed's GB and MB), three significant figures."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{int(count)} B"


def format_table(plans: list[KVPlan]) -> str:
    """A plain-text table of plans, one row each."""
    headers = ["model", "attention", "dtype", "context", "KV/token", "KV/sequence", "vs MHA", "fits", "allocated/token"]
    rows = [headers]
    for p in plans:
        rows.append([
            p.name,
            p.attention,
            p.dtype,
            str(p.context_tokens),
            format_bytes(p.bytes_per_token),
            format_bytes(p.bytes_per_sequence),
            f"1/{p.ratio_to_mha:.3g}",
            "-" if p.num_sequences is None else str(p.num_sequences),
            "-" if p.allocated_bytes_per_token is None else format_bytes(p.allocated_bytes_per_token),
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows)
