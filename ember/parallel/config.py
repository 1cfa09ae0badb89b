"""ParallelConfig: how many ranks, where they meet, and how long a rank may keep the others waiting."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass
class ParallelConfig:
    """How the model is split over ranks (all 1 / False: one process, no torch.distributed).

    One mode at a time:
    - tensor parallel (`tensor_parallel_size` T > 1): heads, inner size and vocabulary split;
    - pipeline parallel (`pipeline_parallel_size` P > 1): contiguous layer ranges per stage;
    - both (T > 1 and P > 1, mode "tensor-pipeline"): T x P ranks, stage-major (rank = stage * T + tensor rank);
      each stage is a tensor-parallel group of T ranks, and each rank sends its activations to the rank of the
      same tensor rank in the next stage;
    - expert parallel (`enable_expert_parallel` with T > 1, MoE families): the routed experts
      split over the T ranks, everything else replicated (vLLM's flag: EP size = TP size).
    `enable_sequence_parallel` (with tensor parallel) reduce-scatters / all-gathers around the
    norms and residuals instead of all-reducing (ember.layers.sequence_parallel).
    `exact_row_parallel` (with tensor parallel) all-gathers the row layers' inputs and outputs
    instead of all-reducing partial sums: one process's float32 numbers, at more bytes
    (ember.layers.parallel.GatheredRowLinear).

    The ranks meet at `master_addr:master_port` (a free port is picked when None). Across
    machines (torchrun-style), `nnodes` nodes run `world_size / nnodes` ranks each;
    node 0 holds rank 0 (the engine and server), the others only workers, and every node is
    given the same master address and a fixed port. A collective
    that waits longer than `collective_timeout_s` for a peer (a dead or hung worker) fails the
    step with an error naming the rank, instead of hanging; `startup_timeout_s` bounds loading.

    `threads_per_rank` (None: rank 0's torch threads shared out evenly over this node's ranks) is
    each rank's torch / OpenMP thread count. Ranks on one machine share its cores: with every rank
    at the whole machine's count, spinning OpenMP threads outnumber the cores and each collective
    waits for descheduled threads (measured: tensor parallel x2 on 2 cores, 2 threads per rank
    23.6 s for 32 tokens, 1 thread per rank 3.1 s).
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    enable_sequence_parallel: bool = False
    exact_row_parallel: bool = False
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    collective_timeout_s: float = 20.0
    startup_timeout_s: float = 600.0
    nnodes: int = 1
    node_rank: int = 0
    threads_per_rank: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.pipeline_parallel_size <= 64:
            raise ValueError("pipeline_parallel_size must be from 1 to 64 (--pipeline-parallel-size)")
        if self.pipeline_parallel_size > 1 and (self.enable_expert_parallel or self.enable_sequence_parallel):
            raise ValueError("pipeline parallelism runs with plain tensor parallelism only: drop --enable-expert-parallel / "
                             "--enable-sequence-parallel, or set --pipeline-parallel-size 1")
        if self.enable_expert_parallel and self.tensor_parallel_size < 2:
            raise ValueError("--enable-expert-parallel splits the experts over --tensor-parallel-size ranks: set it to 2 or more")
        if self.enable_sequence_parallel and (self.tensor_parallel_size < 2 or self.enable_expert_parallel):
            raise ValueError("--enable-sequence-parallel splits tensor parallelism's norms: use it with --tensor-parallel-size 2 or more, without expert parallel")
        if self.exact_row_parallel and (self.mode not in ("tensor", "tensor-pipeline") or self.enable_sequence_parallel):
            raise ValueError("--exact-row-parallel changes tensor parallelism's row layers: use it with --tensor-parallel-size 2 or more, alone")
        if self.nnodes < 1 or self.world_size % self.nnodes:
            raise ValueError("--nnodes must divide the number of ranks (each node runs the same number of ranks)")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be from 0 to {self.nnodes - 1}")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("several nodes need a fixed --master-port (and the same --master-addr) on every node")
        if not 1 <= self.tensor_parallel_size <= 64:
            raise ValueError("tensor_parallel_size must be from 1 to 64 (--tensor-parallel-size)")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ValueError("master_port must be from 1 to 65535 (--master-port)")
        if self.collective_timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError("collective_timeout_s and startup_timeout_s must be positive")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise ValueError("threads_per_rank must be at least 1 (--threads-per-rank)")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def mode(self) -> str:
        """"tensor", "pipeline", "tensor-pipeline" or "expert" ("single" for one process)."""
        if self.pipeline_parallel_size > 1:
            return "tensor-pipeline" if self.tensor_parallel_size > 1 else "pipeline"
        if self.tensor_parallel_size > 1:
            return "expert" if self.enable_expert_parallel else "tensor"
        return "single"

    @property
    def workers_score_logits(self) -> bool:
        """Whether workers take part in scoring (a vocabulary-parallel head); else rank 0 alone holds the head."""
        return self.mode in ("tensor", "tensor-pipeline")

    def scores_logits(self, rank: int) -> bool:
        """Whether `rank` holds a slice of the head: every rank of the first stage's tensor-parallel group."""
        return self.workers_score_logits and rank < self.tensor_parallel_size

    def stage_of(self, rank: int) -> tuple[int, int]:
        """(pipeline stage, tensor rank within the stage) of `rank` (stage-major numbering)."""
        return divmod(rank, self.tensor_parallel_size)

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    @property
    def node_ranks(self) -> range:
        """The ranks this node runs (node 0's first one is rank 0, the engine itself)."""
        per_node = self.world_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    def rank_threads(self, available: int) -> int:
        """torch threads for each of this node's ranks, out of `available` (rank 0's own count) unless set."""
        if self.threads_per_rank is not None:
            return self.threads_per_rank
        return max(1, available // len(self.node_ranks))

    @classmethod
    def split_from_args(cls, args: argparse.Namespace) -> ParallelConfig:
        """How the model is split (the mode flags only), for commands without the rendezvous flags."""
        return cls(**_split_fields(args))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ParallelConfig:
        return cls(
            **_split_fields(args),
            master_addr=args.master_addr,
            master_port=args.master_port,
            collective_timeout_s=args.collective_timeout,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            threads_per_rank=args.threads_per_rank,
        )


def _split_fields(args: argparse.Namespace) -> dict:
    return {
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "enable_expert_parallel": args.enable_expert_parallel,
        "enable_sequence_parallel": args.enable_sequence_parallel,
        "exact_row_parallel": args.exact_row_parallel,
    }


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """The parallelism flags of every command that builds an engine."""
    defaults = ParallelConfig()
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=defaults.tensor_parallel_size,
                        help="ranks the weights and KV cache are split over (worker processes on torch.distributed)")
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=defaults.pipeline_parallel_size,
                        help="pipeline stages the layers are split over (worker processes, activations sent between stages)")
    parser.add_argument("--enable-expert-parallel", action="store_true",
                        help="MoE models: split the routed experts over the --tensor-parallel-size ranks (the rest replicated)")
    parser.add_argument("--enable-sequence-parallel", action="store_true",
                        help="with tensor parallel: norms and residuals on 1/T of the tokens (reduce-scatter + all-gather)")
    parser.add_argument("--exact-row-parallel", action="store_true",
                        help="with tensor parallel: all-gather instead of all-reduce in the row layers; logits bit-identical to one process")
    parser.add_argument("--master-addr", default=defaults.master_addr, help="address where the ranks meet")
    parser.add_argument("--master-port", type=int, default=None, help="port where the ranks meet (default: a free one)")
    parser.add_argument("--nnodes", type=int, default=1, help="machines the ranks span (torchrun-style)")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="this machine's index; nodes other than 0 run workers only (no server)")
    parser.add_argument("--threads-per-rank", type=int, default=None,
                        help="torch threads of each rank (default: this process's threads shared out over the node's ranks)")
    parser.add_argument("--collective-timeout", type=float, default=defaults.collective_timeout_s,
                        help="seconds a rank waits for its peers before the step fails (a dead or hung worker)")
