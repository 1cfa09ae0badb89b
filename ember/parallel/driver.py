"""WorkerGroup: rank 0's handle on the worker ranks: starts them, broadcasts each step, watches them.

Rank 0 (the engine process, or the caller's process for the offline `LLM`) starts one
`python -m ember.parallel.worker` per other rank, joins the gloo group with them, and loads
its own shard. Every later command goes out as one broadcast; the parallel layers then run
their collectives (all-reduces, reduce-scatters, all-gathers, stage-to-stage sends, the logits
gather) inside each rank's forward pass.

A worker that dies breaks the next collective at once (gloo sees the closed connection); one
that hangs breaks it after the collective timeout. Either way the step raises WorkerFailedError
naming the rank and its exit status, and the group is unusable from then on.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ember.kv.cache_manager import BlockCopy
from ember.layers.attention import AttentionMetadata
from ember.models.loader import LoadedModel, load_model
from ember.parallel.communicator import CollectiveError, Communicator
from ember.parallel.config import ParallelConfig
from ember.parallel.group import connect, free_port
from ember.parallel.messages import (
    AllocateKVCache,
    ComputeLogits,
    RunForward,
    StopWorker,
    WorkerCommand,
)
from ember.parallel.modes import shard_factory
from ember.parallel.worker import parameter_bytes

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
EXIT_WAIT_S = 2.0


class WorkerFailedError(RuntimeError):
    """A worker rank died or stopped answering: the engine cannot step again until restarted."""


@dataclass(frozen=True)
class RankMemory:
    """Bytes each rank holds: its weights shard and its KV cache shard (rank order)."""

    parameter_bytes: list[int]
    kv_cache_bytes: list[int]


class WorkerGroup:
    """The worker processes of ranks 1..W-1 and rank 0's communicator with them."""

    def __init__(
        self, communicator: Communicator, processes: list[subprocess.Popen], parallel: ParallelConfig, threads_per_rank: int,
        caller_threads: int,
    ) -> None:
        """`caller_threads`: this process's torch threads before it became rank 0 (given back at shutdown)."""
        self.communicator = communicator
        self.processes = processes
        self.parallel = parallel
        self.threads_per_rank = threads_per_rank
        self.caller_threads = caller_threads
        self.held_layers: range | None = None  # rank 0's layers when they are a pipeline stage's
        self.memory = RankMemory([], [])
        self.failure: str | None = None
        self._finalizer = weakref.finalize(self, _stop_processes, processes)

    @classmethod
    def start(
        cls, model_path: Path, dtype: str, parallel: ParallelConfig, show_progress: bool = False, max_model_len: int | None = None,
        quant_activations: str = "int8",
    ) -> tuple[WorkerGroup, LoadedModel]:
        """Start the workers, join the group as rank 0 and load rank 0's shard.

        This process's torch threads drop to rank 0's share of them (`ParallelConfig.threads_per_rank`) until `shutdown`.
        `quant_activations`: what every rank's quantized layers round their inputs to (rank 0's are set by its engine).
        """
        port = parallel.master_port or free_port(parallel.master_addr)
        caller_threads = torch.get_num_threads()
        threads = parallel.rank_threads(caller_threads)
        processes = [_spawn_worker(rank, model_path, dtype, parallel, port, threads, max_model_len, quant_activations)
                     for rank in parallel.node_ranks if rank != 0]
        try:
            communicator = connect(
                0, parallel.world_size, parallel.master_addr, port, parallel.collective_timeout_s, parallel.startup_timeout_s,
                peer_failure=lambda: _first_exit(processes),
            )
            group = cls(communicator, processes, parallel, threads, caller_threads)
            torch.set_num_threads(threads)
            logger.info("%s parallel x%d: %d torch thread(s) per rank", parallel.mode, parallel.world_size, threads)
            loaded = load_model(model_path, dtype, show_progress, shard_factory(communicator, parallel), max_model_len)
            assert loaded.shard is not None
            group.held_layers = loaded.shard.held_layers
            sizes = group._gather_sizes(parameter_bytes(loaded.model), parallel.startup_timeout_s)
            group.memory = RankMemory(sizes, [])
        except BaseException:
            _stop_processes(processes)
            torch.set_num_threads(caller_threads)
            raise
        return group, loaded

    # -- commands -----------------------------------------------------------------------------

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, driver_kv_bytes: int) -> None:
        """Every worker allocates its KV shard of `num_blocks` blocks in `dtype`; rank 0 (which has) gives its size."""
        self._broadcast(AllocateKVCache(num_blocks, block_size, dtype))
        self.memory = RankMemory(self.memory.parameter_bytes, self._gather_sizes(driver_kv_bytes))

    def forward(
        self, block_copies: list[BlockCopy], input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        self._broadcast(RunForward(block_copies, input_ids, positions, metadata))

    def compute_logits(self, hidden: torch.Tensor) -> None:
        """Workers score their vocabulary slices (tensor parallel); otherwise rank 0 holds the whole head: nothing to send."""
        if self.parallel.workers_score_logits:
            self._broadcast(ComputeLogits(hidden))

    def shutdown(self) -> None:
        """Tell the workers to stop and wait for them (killing any that do not stop in time)."""
        if self.failure is None:
            with contextlib.suppress(CollectiveError):
                self.communicator.broadcast_object(StopWorker())
        self._finalizer()
        torch.set_num_threads(self.caller_threads)

    # -- health -------------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise WorkerFailedError if a worker has exited (or an earlier collective failed)."""
        self._note_exits()
        if self.failure is not None:
            raise WorkerFailedError(self.failure)

    def _note_exits(self, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        if self.failure is None:
            self.failure = _first_exit(self.processes)

    @contextlib.contextmanager
    def failures(self) -> Iterator[None]:
        """Turn a failed collective inside the block (a broken group) into WorkerFailedError naming the rank."""
        self.check_alive()
        try:
            yield
        except CollectiveError as error:
            self._note_exits(wait_s=EXIT_WAIT_S)  # a killed worker breaks the group a moment before it is reaped
            if self.failure is None:
                self.failure = f"a worker stopped answering: {error}"
            raise WorkerFailedError(self.failure) from error

    def _broadcast(self, command: WorkerCommand) -> None:
        with self.failures():
            self.communicator.broadcast_object(command)

    def _gather_sizes(self, driver_value: int, timeout_s: float | None = None) -> list[int]:
        sizes = self.communicator.gather_to_driver(torch.tensor([driver_value]), timeout_s)
        assert sizes is not None
        return [int(size.item()) for size in sizes]


def _first_exit(processes: list[subprocess.Popen]) -> str | None:
    """Which worker has exited, if any (rank order)."""
    for rank, process in enumerate(processes, 1):
        if process.poll() is not None:
            return f"worker rank {rank} (pid {process.pid}) exited with status {process.returncode}"
    return None


def run_worker_node(model_path: Path, dtype: str, parallel: ParallelConfig, max_model_len: int | None = None,
                    quant_activations: str = "int8") -> int:
    """A node other than 0: start this node's ranks and wait for them; returns the first non-zero exit status."""
    if parallel.node_rank == 0 or parallel.master_port is None:
        raise ValueError("run_worker_node runs nodes 1.. of a multi-node group, with a fixed --master-port")
    threads = parallel.rank_threads(torch.get_num_threads())
    processes = [_spawn_worker(rank, model_path, dtype, parallel, parallel.master_port, threads, max_model_len, quant_activations)
                 for rank in parallel.node_ranks]
    try:
        statuses = [process.wait() for process in processes]
    finally:
        _stop_processes(processes)
    return next((status for status in statuses if status), 0)


def _spawn_worker(rank: int, model_path: Path, dtype: str, parallel: ParallelConfig, port: int, threads: int,
                  max_model_len: int | None, quant_activations: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "ember.parallel.worker",
        "--model", str(model_path), "--dtype", dtype,
        "--rank", str(rank), "--tensor-parallel-size", str(parallel.tensor_parallel_size),
        "--pipeline-parallel-size", str(parallel.pipeline_parallel_size),
        *(["--enable-expert-parallel"] if parallel.enable_expert_parallel else []),
        *(["--enable-sequence-parallel"] if parallel.enable_sequence_parallel else []),
        *(["--exact-row-parallel"] if parallel.exact_row_parallel else []),
        "--master-addr", parallel.master_addr, "--master-port", str(port),
        "--collective-timeout", str(parallel.collective_timeout_s),
        "--startup-timeout", str(parallel.startup_timeout_s),
        "--threads", str(threads), "--quant-activations", quant_activations,
        *(["--max-model-len", str(max_model_len)] if max_model_len else []),
    ]  # fmt: skip
    # stdin is the worker's lifeline: only this process holds the write end.
    return subprocess.Popen(command, stdin=subprocess.PIPE)


def _stop_processes(processes: list[subprocess.Popen]) -> None:
    """Close each lifeline (the worker exits), wait a little, kill what is left."""
    for process in processes:
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()
    for process in processes:
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("tensor-parallel worker pid %d did not stop; killing it", process.pid)
            process.kill()
            process.wait()
