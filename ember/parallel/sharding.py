"""Which slice of every weight a tensor-parallel rank holds, and the layers that join the slices.

Heads are split by KV group: a rank holds whole groups (its KV heads and the query heads that
read them), so grouped-query attention runs unchanged on each rank. Two cases:

- at least as many KV heads as ranks: the KV heads are split as evenly as they go. When they do
  not divide (SmolLM2: 3 KV heads over 2 ranks) the ranks hold 2 and 1 groups: uneven work,
  exact math, no weight held twice.
- fewer KV heads than ranks (MQA, or 2 KV heads over 4 ranks): the query heads are split evenly
  and each rank holds a copy of the one KV head its queries read (replicated).

The MLP's inner size and the vocabulary are split as evenly as they go (slices differ by at
most one). A rank's model is built from `local_config()` (its head and inner counts), so the
model file builds the column-parallel projections at their local size without knowing about
ranks; `shard_modules` then swaps in the layers that communicate (ember.layers.parallel).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torch import nn

from ember.config.model import ModelConfig
from ember.layers.norm import RMSNorm
from ember.layers.parallel import (
    GatheredRowLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from ember.layers.sequence_parallel import (
    SequenceParallelEmbedding,
    SequenceParallelRMSNorm,
    SequenceParallelRowLinear,
    SequenceSplit,
)
from ember.models.family_registry import family_of, family_specs
from ember.models.shard import ModelShard, TensorSlice
from ember.parallel.communicator import Communicator

# Checkpoint (transformers) name of a projection -> which split of its output rows (column) or input columns (row).
_COLUMN_PARALLEL = {
    "self_attn.q_proj": "query",
    "self_attn.k_proj": "kv",
    "self_attn.v_proj": "kv",
    "mlp.gate_proj": "inner",
    "mlp.up_proj": "inner",
}
_ROW_PARALLEL = {"self_attn.o_proj": "query", "mlp.down_proj": "inner"}
_VOCAB_PARALLEL = ("model.embed_tokens.weight", "lm_head.weight")
_HEAD_NORMS = ("self_attn.q_norm", "self_attn.k_norm")  # Qwen3's norms over each head: a rank's own heads, not split by tokens


@dataclass(frozen=True)
class Span:
    """Indices [start, stop) of one rank's part."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def scaled(self, factor: int) -> Span:
        return Span(self.start * factor, self.stop * factor)


def balanced_spans(total: int, parts: int) -> list[Span]:
    """`total` items in `parts` contiguous spans whose sizes differ by at most one (larger first)."""
    base, extra = divmod(total, parts)
    spans, start = [], 0
    for part in range(parts):
        size = base + (1 if part < extra else 0)
        spans.append(Span(start, start + size))
        start += size
    return spans


def head_spans(num_heads: int, num_kv_heads: int, world_size: int) -> list[tuple[Span, Span]]:
    """(query heads, KV heads) of each rank; see the module docstring for the two cases."""
    group = num_heads // num_kv_heads
    if num_kv_heads >= world_size:
        return [(kv.scaled(group), kv) for kv in balanced_spans(num_kv_heads, world_size)]
    if world_size % num_kv_heads or num_heads % world_size:
        raise ValueError(
            f"{num_heads} query heads and {num_kv_heads} KV heads cannot be split over {world_size} ranks: with fewer "
            f"KV heads than ranks, the ranks must be a multiple of the KV heads and divide the query heads; "
            f"choose a tensor_parallel_size that divides {num_kv_heads} or is a multiple of it dividing {num_heads}"
        )
    per_rank = num_heads // world_size
    return [(Span(r * per_rank, (r + 1) * per_rank), Span(r * per_rank // group, r * per_rank // group + 1)) for r in range(world_size)]


@dataclass(frozen=True)
class TensorParallelShard(ModelShard):
    """Rank `rank` of `world_size`: its heads, inner slice and vocabulary slice of `config`.

    `communicator` (the rank's group) is what the swapped-in layers talk through.
    """

    config: ModelConfig
    rank: int
    world_size: int
    communicator: Communicator | None = field(default=None, compare=False)
    is_sequence_parallel: bool = False  # reduce-scatter / all-gather around the norms (ember.layers.sequence_parallel)
    is_exact_row_parallel: bool = False  # row layers as GatheredRowLinear: one process's sums, more bytes

    def __post_init__(self) -> None:
        if not family_of(self.config.architecture).is_tensor_parallel:
            splittable = ", ".join(spec.architecture for spec in family_specs() if spec.is_tensor_parallel)
            raise ValueError(
                f"tensor parallelism runs the {splittable} families, not "
                f"{self.config.architecture!r}; run it with tensor_parallel_size=1"
            )
        if self.config.intermediate_size < self.world_size or self.config.vocab_size < self.world_size:
            raise ValueError(f"the model is too small to split over {self.world_size} ranks; use fewer")
        head_spans(self.config.num_heads, self.config.num_kv_heads, self.world_size)  # raises if they cannot split

    @property
    def query_heads(self) -> Span:
        return head_spans(self.config.num_heads, self.config.num_kv_heads, self.world_size)[self.rank][0]

    @property
    def kv_heads(self) -> Span:
        return head_spans(self.config.num_heads, self.config.num_kv_heads, self.world_size)[self.rank][1]

    @property
    def inner(self) -> Span:
        return balanced_spans(self.config.intermediate_size, self.world_size)[self.rank]

    @property
    def vocab_spans(self) -> list[Span]:
        return balanced_spans(self.config.vocab_size, self.world_size)

    def local_config(self) -> ModelConfig:
        """The config this rank's model is built from: its own head and inner counts."""
        return replace(
            self.config,
            num_heads=self.query_heads.size,
            num_kv_heads=self.kv_heads.size,
            intermediate_size=self.inner.size,
        )

    def slice_for(self, name: str) -> TensorSlice | None:
        """The part of checkpoint tensor `name` this rank loads (None: the whole tensor)."""
        if name in _VOCAB_PARALLEL:
            span = self.vocab_spans[self.rank]
            return TensorSlice(0, span.start, span.stop)
        module, _, kind = name.rpartition(".")
        for suffix, split in _COLUMN_PARALLEL.items():
            if module.endswith(suffix):
                span = self._span(split)
                return TensorSlice(0, span.start, span.stop)
        for suffix, split in _ROW_PARALLEL.items():
            if module.endswith(suffix) and self.is_exact_row_parallel:
                span = self.hidden_spans[self.rank]  # whole rows of this rank's outputs, and their bias
                return TensorSlice(0, span.start, span.stop)
            if module.endswith(suffix) and kind == "weight":
                span = self._span(split)
                return TensorSlice(1, span.start, span.stop)
        return None

    @property
    def hidden_spans(self) -> list[Span]:
        return balanced_spans(self.config.hidden_size, self.world_size)

    def row_input_sizes(self, split: str) -> list[int]:
        """Every rank's input columns of a row layer fed by `split` ("query" or "inner")."""
        shards = [replace(self, rank=rank, communicator=None) for rank in range(self.world_size)]
        return [shard._span(split).size for shard in shards]

    def _span(self, split: str) -> Span:
        head_dim = self.config.head_dim
        return {"query": self.query_heads.scaled(head_dim), "kv": self.kv_heads.scaled(head_dim), "inner": self.inner}[split]

    def shard_modules(self, model: nn.Module) -> None:
        """Swap the layers that join slices (row-parallel outputs, vocabulary) into a model built from `local_config()`."""
        communicator = self.communicator
        if communicator is None:
            raise ValueError("shard_modules needs the rank's communicator; build the shard with one")
        if self.is_sequence_parallel:
            self._shard_sequence_parallel(model, communicator)
            return
        hidden = self.config.hidden_size
        vocab = self.vocab_spans[self.rank]
        for name, module in list(model.named_modules()):
            split = next((split for suffix, split in _ROW_PARALLEL.items() if name.endswith(suffix)), None)
            if split is not None and self.is_exact_row_parallel:
                input_sizes, output_sizes = self.row_input_sizes(split), [span.size for span in self.hidden_spans]
                _replace(model, name, GatheredRowLinear(input_sizes, output_sizes, module.bias is not None, communicator))
            elif split is not None:
                row = RowParallelLinear(module.in_features, module.out_features, module.bias is not None, communicator)
                _replace(model, name, row)
            elif name == "model.embed_tokens":
                _replace(model, name, VocabParallelEmbedding(vocab.start, vocab.size, hidden, communicator))
            elif name == "lm_head":
                _replace(model, name, ParallelLMHead([span.size for span in self.vocab_spans], hidden, communicator))

    def _shard_sequence_parallel(self, model: nn.Module, communicator: Communicator) -> None:
        """As `shard_modules`, with the collectives around the norms split by tokens (one `SequenceSplit` shared)."""
        config, split = self.config, SequenceSplit(self.world_size)
        vocab = self.vocab_spans[self.rank]
        for name, module in list(model.named_modules()):
            if any(name.endswith(suffix) for suffix in _ROW_PARALLEL):
                new: nn.Module = SequenceParallelRowLinear(module.in_features, module.out_features, module.bias is not None, communicator, split)
            elif isinstance(module, RMSNorm) and not name.endswith(_HEAD_NORMS):
                new = SequenceParallelRMSNorm(config.hidden_size, config.rms_norm_eps, communicator, split)
            elif name == "model.embed_tokens":
                new = SequenceParallelEmbedding(vocab.start, vocab.size, config.hidden_size, communicator, split)
            elif name == "lm_head":
                new = ParallelLMHead([span.size for span in self.vocab_spans], config.hidden_size, communicator)
            else:
                continue
            _replace(model, name, new)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
