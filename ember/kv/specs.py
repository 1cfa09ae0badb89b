"""Per-layer KV specs: what one layer keeps per token, and how layers group over one block pool.

A model says, layer by layer, what its cache holds: full keys and values (`FullAttentionSpec`),
keys and values of the last `window` tokens only (`SlidingWindowSpec`), or DeepSeek-V2's
compressed latent plus its decoupled rope key (`LatentAttentionSpec`). `KVCacheLayout` turns
that list into layer groups: layers with the same window share one block table per sequence.
The pool's block ids are shared by the groups; layer `k` of every group reads the same cache
tensor, so one block id costs `max group size` layers of memory, not `num_layers` (a hybrid
model keeps full KV only for its global layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class FullAttentionSpec:
    """Keys and values of every token: cache `[2, num_blocks, block_size, num_kv_heads, head_dim]`."""

    num_kv_heads: int
    head_dim: int

    @property
    def window(self) -> int | None:
        return None

    def elements_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True)
class SlidingWindowSpec:
    """Keys and values of the last `window` tokens (a query at p sees keys p - window + 1 .. p)."""

    num_kv_heads: int
    head_dim: int
    window: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"sliding window must be at least 1 token, got {self.window}")

    def elements_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True)
class LatentAttentionSpec:
    """MLA: the compressed latent (`kv_lora_rank`) and the shared rope key (`rope_head_dim`) per token.

    Cache `[num_blocks, block_size, kv_lora_rank + rope_head_dim]`: latent first, rope key last.
    """

    kv_lora_rank: int
    rope_head_dim: int

    @property
    def window(self) -> int | None:
        return None

    def elements_per_token(self) -> int:
        return self.kv_lora_rank + self.rope_head_dim

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.kv_lora_rank + self.rope_head_dim)


KVCacheSpec = FullAttentionSpec | SlidingWindowSpec | LatentAttentionSpec


@dataclass(frozen=True)
class KVCacheLayout:
    """Layers grouped by window over one block pool, and the cache tensor each layer uses.

    `group_windows[g]` is the window of group g (None: every token kept); group 0 is the first
    layer's group. `layer_groups[i]` and `layer_tensors[i]` say which group and which cache
    tensor layer i uses. When every layer's cache has the same shape, the i-th layer of each
    group shares tensor i (block ids are never held by two groups at once, so the groups never
    collide); otherwise every layer has a tensor of its own.
    """

    specs: tuple[KVCacheSpec, ...]
    group_windows: tuple[int | None, ...]
    layer_groups: tuple[int, ...]
    layer_tensors: tuple[int, ...]

    @classmethod
    def from_specs(cls, specs: list[KVCacheSpec] | tuple[KVCacheSpec, ...]) -> KVCacheLayout:
        if not specs:
            raise ValueError("a model needs at least one layer with a KV cache")
        windows: list[int | None] = []
        layer_groups = []
        for spec in specs:
            if spec.window not in windows:
                windows.append(spec.window)
            layer_groups.append(windows.index(spec.window))
        shapes = {spec.cache_shape(1, 1) for spec in specs}
        if len(shapes) == 1:
            seen = [0] * len(windows)
            layer_tensors = []
            for group in layer_groups:
                layer_tensors.append(seen[group])
                seen[group] += 1
        else:
            layer_tensors = list(range(len(specs)))
        return cls(tuple(specs), tuple(windows), tuple(layer_groups), tuple(layer_tensors))

    @property
    def num_tensors(self) -> int:
        return max(self.layer_tensors) + 1

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    def tensor_spec(self, tensor_index: int) -> KVCacheSpec:
        """The spec of (the first) layer reading cache tensor `tensor_index`."""
        return self.specs[self.layer_tensors.index(tensor_index)]

    def bytes_per_block(self, block_size: int, element_size: int) -> int:
        """Bytes one block id costs over every cache tensor."""
        per_token = sum(self.tensor_spec(t).elements_per_token() for t in range(self.num_tensors))
        return per_token * block_size * element_size

    def bytes_per_token(self, element_size: int) -> int:
        """KV bytes per cached token summed over all layers (the formula, before windows or sharing)."""
        return sum(spec.elements_per_token() for spec in self.specs) * element_size

    def bytes_per_sequence(self, num_tokens: int, element_size: int) -> int:
        """Bytes one sequence of `num_tokens` holds: windowed layers keep at most their window."""
        total = 0
        for spec in self.specs:
            kept = num_tokens if spec.window is None else min(num_tokens, spec.window)
            total += spec.elements_per_token() * kept
        return total * element_size


class LatentShape(Protocol):
    """What the cache keeps per token of a DeepSeek-V2 latent attention layer (ember.config.model.LatentAttentionConfig)."""

    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...


class AttentionShape(Protocol):
    """What the KV cache reads of a model's config (ember.config.model.ModelConfig has it): declared here so
    kv imports nothing from the models above it."""

    @property
    def num_layers(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def mla(self) -> LatentShape | None: ...

    def window_of(self, layer: int) -> int | None:
        """The sliding window of `layer` in tokens, or None when it attends to every token."""


def kv_specs_for(config: AttentionShape) -> list[KVCacheSpec]:
    """Per-layer specs of a model config: latent for MLA, else full or windowed attention per layer."""
    if config.mla is not None:
        return [LatentAttentionSpec(config.mla.kv_lora_rank, config.mla.qk_rope_head_dim)] * config.num_layers
    specs: list[KVCacheSpec] = []
    for layer in range(config.num_layers):
        window = config.window_of(layer)
        if window is None:
            specs.append(FullAttentionSpec(config.num_kv_heads, config.head_dim))
        else:
            specs.append(SlidingWindowSpec(config.num_kv_heads, config.head_dim, window))
    return specs
