"""CUDA graphs of decode steps: captured once at start for a few batch sizes, replayed for every decode-only step.

A decode step of B sequences runs as the captured graph of the smallest captured size >= B: its inputs are copied
into static buffers (rows B.. padded with a harmless decode of one token that writes its key and value to a scratch
block no sequence owns), the graph replays, and the first B rows of its output are the step's hidden states. A
step a graph cannot run (a prompt chunk, drafted tokens, more sequences than the largest size, a block table wider
than the buffers) runs eagerly. Only a CUDA runner without --enforce-eager builds one; with `capture=False` the
same static-buffer path runs eagerly (how the CPU tests check padding and bucket choice).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ember.layers.attention import AttentionMetadata
from ember.layers.cpu_attention import PagedBatch

# Forward over (input_ids, positions, metadata) -> final hidden states [tokens, hidden].
DecodeForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
SMALL_SIZES = (1, 2, 4)  # then every STEP up to the largest (vLLM's ladder: padding wastes at most 7 rows)
STEP = 8


@dataclass(frozen=True)
class GraphSettings:
    """What a runner builds its `DecodeGraphs` from: the sizes, the block table width of the longest context, and
    whether to capture (False: the static-buffer path runs eagerly, which a CPU can run)."""

    sizes: tuple[int, ...]
    max_blocks_per_seq: int
    capture: bool = True


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes captured for an engine of `max_num_seqs` sequences: 1, 2, 4, then multiples of 8, ending at
    max_num_seqs itself (so every decode batch the scheduler can form has a graph)."""
    if max_num_seqs < 1:
        raise ValueError("max_num_seqs must be at least 1")
    ladder = [size for size in (*SMALL_SIZES, *range(STEP, max_num_seqs, STEP)) if size < max_num_seqs]
    return (*ladder, max_num_seqs)


def padded_size(num_seqs: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds `num_seqs` decode rows; None when none does (the step runs eagerly)."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if index < len(sizes) else None


class DecodeGraphs:
    """Static input buffers of the largest size, one captured graph per size over views of them, one memory pool.

    Invariant: a graph of size S reads rows [0, S) of the buffers, and `run` writes all of those rows before each
    replay, so padding rows never carry a previous step's sequences (columns of a block table past a row's context
    may hold stale ids: the attention kernels read only the blocks under `context_lens`).
    """

    def __init__(self, forward: DecodeForward, sizes: Sequence[int], max_blocks_per_seq: int, block_size: int,
                 scratch_block: int, device: torch.device) -> None:
        """`scratch_block`: a KV block no sequence is given (padding rows write there); `max_blocks_per_seq`: the
        block table width a sequence of the engine's longest context needs."""
        self.forward = forward
        self.sizes = tuple(sizes)
        self.block_size = block_size
        self.scratch_block = scratch_block
        largest = self.sizes[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((largest,), scratch_block * block_size, dtype=torch.long, device=device)
        self.block_tables = torch.full((largest, max_blocks_per_seq), -1, dtype=torch.int32, device=device)
        self.block_tables[:, 0] = scratch_block
        self.query_starts = torch.arange(largest, dtype=torch.int32, device=device)
        self.query_counts = torch.ones(largest, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(largest, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_tables.shape[1]

    def metadata(self, size: int) -> AttentionMetadata:
        """The attention metadata of a decode step of `size` rows, over views of the static buffers."""
        paged = PagedBatch(self.block_tables[:size], self.query_starts[:size], self.query_counts[:size],
                           self.context_lens[:size], max_query_count=1)
        return AttentionMetadata(slot_mapping=self.slot_mapping[:size], prefills=[], decode_rows=None, paged=paged)

    def capture(self, warmup_steps: int = 2) -> None:
        """Capture a graph per size, largest first, all in one memory pool (a smaller graph's memory fits in the
        largest's). The buffers hold padding rows while capturing: the warm-up and captured steps write only the
        scratch block."""
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the default stream, as torch.cuda.graph requires
            for size in reversed(self.sizes):
                for _ in range(warmup_steps):  # compiles the Triton kernels' specializations outside the capture
                    self._forward(size)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for size in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def holds(self, num_seqs: int, tables: list[list[int]]) -> bool:
        """Whether a decode step of `num_seqs` sequences with block tables `tables` fits a size and the buffers."""
        return (num_seqs > 0 and padded_size(num_seqs, self.sizes) is not None
                and max(map(len, tables)) <= self.max_blocks_per_seq)

    def run(self, token_ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Hidden states [len(token_ids), hidden] of a decode step (sequence i: one token at `positions[i]` into
        `slots[i]`, block table `tables[i]`) that `holds` said fits."""
        count = len(token_ids)
        size = padded_size(count, self.sizes)
        width = max(len(table) for table in tables)
        assert size is not None and width <= self.max_blocks_per_seq, "a step `holds` refused"
        padding = size - count
        scratch_slot = self.scratch_block * self.block_size
        # One host tensor for the per-row numbers, copied in one transfer; then the tables' used columns.
        rows = torch.tensor([[*token_ids, *[0] * padding], [*positions, *[0] * padding], [*slots, *[scratch_slot] * padding],
                             [position + 1 for position in positions] + [1] * padding], dtype=torch.long)
        rows = rows.to(self.input_ids.device, non_blocking=True)
        self.input_ids[:size].copy_(rows[0])
        self.positions[:size].copy_(rows[1])
        self.slot_mapping[:size].copy_(rows[2])
        self.context_lens[:size].copy_(rows[3])
        host_tables = torch.tensor([[*table, *[-1] * (width - len(table))] for table in tables]
                                   + [[self.scratch_block, *[-1] * (width - 1)]] * padding, dtype=torch.int32)
        self.block_tables[:size, :width].copy_(host_tables, non_blocking=True)
        graph = self.graphs.get(size)
        if graph is None:
            return self._forward(size)[:count]
        graph.replay()
        return self.outputs[size][:count]

    def _forward(self, size: int) -> torch.Tensor:
        return self.forward(self.input_ids[:size], self.positions[:size], self.metadata(size))
