"""The KV cache's tensors: every layer's cache for a model's layout, and the dtypes a cache may take.

The cache manager hands out block ids; these tensors are the memory those ids index. They live
with the rest of the KV cache, so the engine's runner and a parallel worker rank both build them
from here.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ember.kv.cache_manager import BlockCopy
from ember.kv.specs import KVCacheLayout, KVCacheSpec, LatentAttentionSpec

# Every `CacheConfig.kv_cache_dtype` (ember.engine.config.KV_CACHE_DTYPES, validated there) but "auto".
KV_CACHE_TORCH_DTYPES = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def kv_cache_torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a validated `CacheConfig.kv_cache_dtype`; None for "auto" (the model's compute dtype)."""
    return KV_CACHE_TORCH_DTYPES.get(name)


class DeclaresKVSpecs(Protocol):
    """What the KV cache reads of a model: its per-layer KV specs (every ember.models CausalLM declares them)."""

    def kv_cache_specs(self) -> list[KVCacheSpec]: ...


def kv_cache_layout(model: DeclaresKVSpecs) -> KVCacheLayout:
    """The model's per-layer KV specs (`model.kv_cache_specs()`) as layer groups."""
    return KVCacheLayout.from_specs(model.kv_cache_specs())


class KVCacheTensors:
    """Every layer's KV cache for a model's layout: the tensors, each layer's view, block copies."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        held_layers: range | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        """`held_layers` (a pipeline stage's): only their cache tensors get blocks; the others stay empty.
        `dtype` None: the model's parameter dtype; `device` None: the CPU."""
        dtype = dtype or next(model.parameters()).dtype
        self.dtype = dtype
        self.layout = kv_cache_layout(model)
        used = {self.layout.layer_tensors[i] for i in (held_layers if held_layers is not None else range(len(self.layout.specs)))}
        self.tensors = [
            torch.zeros(self.layout.tensor_spec(t).cache_shape(num_blocks if t in used else 0, block_size), dtype=dtype,
                        device=device)
            for t in range(self.layout.num_tensors)
        ]
        # Layer i's cache; layers of different groups may share a tensor (see KVCacheLayout).
        self.layer_caches = [self.tensors[t] for t in self.layout.layer_tensors]

    @property
    def num_bytes(self) -> int:
        """Bytes allocated for KV, every cache tensor counted once."""
        return sum(cache.numel() * cache.element_size() for cache in self.tensors)

    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        if not copies:
            return
        sources = torch.tensor([c.source for c in copies])
        destinations = torch.tensor([c.destination for c in copies])
        for t, cache in enumerate(self.tensors):
            if cache.numel() == 0:
                continue  # another pipeline stage's layers
            if isinstance(self.layout.tensor_spec(t), LatentAttentionSpec):
                cache[destinations] = cache[sources]
            else:
                cache[:, destinations] = cache[:, sources]
