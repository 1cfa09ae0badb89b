"""Where a pipeline's stage boundaries fall: contiguous layer ranges with the heaviest stage as light as it goes.

Stage 0 holds the embedding table and the LM head besides its layers (one table when they are
tied), which for a small model weighs as much as several layers (SmolLM2: 28M of 135M
parameters, eight layers' worth): an even count of layers per stage left rank 0 with 1.21x its
share of the weights. So stages are balanced by parameters, counted from the config (each
layer's projections, MoE experts or latent attention included), and stage 0 takes fewer layers.
Every rank computes the same split from the same config.
"""

from __future__ import annotations

from ember.config.model import ModelConfig
from ember.parallel.sharding import Span


def stage_spans(config: ModelConfig, num_stages: int) -> list[Span]:
    """Each stage's layers, in order: every stage at least one layer, the largest stage total (stage 0 counting
    the embedding and head) the smallest possible; among equal splits, the later stages take the extra."""
    weights = [layer_parameters(config, layer) for layer in range(config.num_layers)]
    return _min_max_partition(weights, num_stages, first_extra=first_stage_parameters(config))


def first_stage_parameters(config: ModelConfig) -> int:
    """Parameters stage 0 holds besides its layers: the embedding table, and the LM head unless tied to it."""
    table = config.vocab_size * config.hidden_size
    return table if config.tie_word_embeddings else 2 * table


def layer_parameters(config: ModelConfig, layer: int) -> int:
    """Weights of one decoder layer's projections (norms and biases are too small to move a boundary)."""
    return _attention_parameters(config) + _mlp_parameters(config, layer)


def _attention_parameters(config: ModelConfig) -> int:
    hidden, heads = config.hidden_size, config.num_heads
    mla = config.mla
    if mla is None:
        query, kv = heads * config.head_dim, config.num_kv_heads * config.head_dim
        return hidden * (2 * query + 2 * kv)
    query_dim = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    query = hidden * query_dim if mla.q_lora_rank is None else mla.q_lora_rank * (hidden + query_dim)
    latent = hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim)
    expand = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return query + latent + expand + heads * mla.v_head_dim * hidden


def _mlp_parameters(config: ModelConfig, layer: int) -> int:
    hidden, moe = config.hidden_size, config.moe
    if moe is None or layer in moe.dense_layers:
        return 3 * hidden * config.intermediate_size
    experts = moe.num_experts * 3 * hidden * moe.expert_intermediate_size
    return experts + 3 * hidden * moe.shared_intermediate_size + hidden * moe.num_experts  # + shared expert, router


def _min_max_partition(weights: list[int], parts: int, first_extra: int) -> list[Span]:
    """Contiguous spans of `weights` minimising the heaviest span (the first one also carries `first_extra`)."""
    count = len(weights)
    if not 1 <= parts <= count:
        raise ValueError(f"{count} layers cannot fill {parts} pipeline stages: use at most {count} stages")
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    # heaviest[p][i]: the lightest heaviest span splitting the last count - i layers into p spans (p >= 1).
    heaviest = [[0] * (count + 1) for _ in range(parts + 1)]
    cut = [[0] * (count + 1) for _ in range(parts + 1)]
    for i in range(count):
        heaviest[1][i] = prefix[count] - prefix[i]
        cut[1][i] = count
    for p in range(2, parts + 1):
        for i in range(count - p + 1):
            extra = first_extra if p == parts and i == 0 else 0
            # on a tie the earliest end: the earlier span stays shorter (the later stages take the extra)
            heaviest[p][i], cut[p][i] = min(
                (max(extra + prefix[end] - prefix[i], heaviest[p - 1][end]), end) for end in range(i + 1, count - p + 2)
            )
    spans, start = [], 0
    for p in range(parts, 0, -1):
        end = cut[p][start]
        spans.append(Span(start, end))
        start = end
    return spans
