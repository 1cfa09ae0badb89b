"""Communicator: one rank's gloo process group, with every collective counted.

A thin wrapper over `torch.distributed.ProcessGroupGloo` (built without the global default
group, so two engines in one process never collide). Where every rank shares one machine, the
float32 all-reduces, reduce-scatters and all-gathers go through a shared memory segment instead
(ember.parallel.shared_exchange: microseconds where gloo takes a millisecond); the rest stays on
gloo. Each call records the bytes this rank sends under the textbook algorithm of that
collective (whichever path carried it), and the time it spent waiting in it:

- all-reduce (ring): 2 (W - 1) / W * N bytes of an N-byte tensor
- gather to rank 0: N bytes from every other rank, none from rank 0
- broadcast from rank 0: (W - 1) * N bytes from rank 0, none from the others
- reduce-scatter (ring) of an N-byte tensor into W row blocks: (W - 1) / W * N bytes
- all-gather (ring) of N / W-byte row blocks into an N-byte tensor: (W - 1) / W * N bytes
- send to one peer (pipeline stages): N bytes; a receive sends nothing (its wait is counted)

gloo's own wire bytes are not observable from Python; these counts are what the formulas of
ember.parallel.volume predict, and the test holds one to the other.
"""

from __future__ import annotations

import datetime
import pickle
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist

from ember.parallel.shared_exchange import ExchangeFailed, SharedExchange

T = TypeVar("T")


class CollectiveError(RuntimeError):
    """A collective failed: a peer died, hung past the timeout, or the group was torn down."""


@dataclass
class CollectiveStats:
    """Bytes sent, calls and seconds spent per collective kind (e.g. "all_reduce", "gather")."""

    bytes_sent: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)

    def record(self, kind: str, num_bytes: float, seconds: float) -> None:
        self.bytes_sent[kind] += num_bytes
        self.calls[kind] += 1
        self.seconds[kind] += seconds

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.calls.clear()
        self.seconds.clear()

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


class Communicator:
    """The collectives one rank runs with its peers; rank 0 is the driver (the engine process). The parallel layers
    see it as `ember.layers.collectives.Collectives`."""

    def __init__(
        self, group: dist.ProcessGroupGloo, rank: int, world_size: int, timeout_s: float, store: dist.Store | None = None,
        exchange: SharedExchange | None = None, peer_failure: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`exchange`: the group's shared segment (every rank on this machine), else None. `peer_failure`: what
        is known wrong with a peer (a worker's exit, as rank 0 sees it), asked while a shared exchange waits."""
        self.group = group
        self.store = store  # the group reads from its store: it lives as long as the group
        self.rank = rank
        self.world_size = world_size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.stats = CollectiveStats()
        self.exchange = exchange
        self.peer_failure = peer_failure

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place; returns it."""
        ring_bytes = 2 * (self.world_size - 1) / self.world_size * _nbytes(tensor)
        if self._is_shared(tensor) and tensor.is_contiguous():
            self._run_shared("all_reduce", ring_bytes, lambda: self.exchange.all_reduce(tensor, *self._shared_waits))
            return tensor
        options = dist.AllreduceOptions()
        options.timeout = self.timeout
        self._run("all_reduce", ring_bytes, lambda: self.group.allreduce([tensor], options))
        return tensor

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks and keep row block `rank` of W equal blocks (rows must divide by W)."""
        ring_bytes = (self.world_size - 1) / self.world_size * _nbytes(tensor)
        if self._is_shared(tensor):  # the same sums as gloo's, then this rank's block of them
            summed = tensor.contiguous().clone()
            self._run_shared("reduce_scatter", ring_bytes, lambda: self.exchange.all_reduce(summed, *self._shared_waits))
            return summed.chunk(self.world_size)[self.rank]
        options = dist.ReduceScatterOptions()
        options.timeout = self.timeout
        blocks = list(tensor.contiguous().chunk(self.world_size))
        out = torch.empty_like(blocks[0])
        self._run("reduce_scatter", ring_bytes, lambda: self.group.reduce_scatter([out], [blocks], options))
        return out

    def all_gather(self, block: torch.Tensor) -> torch.Tensor:
        """Every rank's `block` (same shape on all ranks) stacked along rows, in rank order."""
        block = block.contiguous()
        ring_bytes = (self.world_size - 1) * _nbytes(block)
        if self._is_shared(block):
            return self._run_shared("all_gather", ring_bytes, lambda: self.exchange.all_gather(block, *self._shared_waits))
        blocks = [torch.empty_like(block) for _ in range(self.world_size)]
        self._run("all_gather", ring_bytes, lambda: self.group.allgather(blocks, block, self.timeout))
        return torch.cat(blocks)

    def gather_to_driver(self, tensor: torch.Tensor, timeout_s: float | None = None) -> list[torch.Tensor] | None:
        """Every rank's `tensor` (same shape on all ranks) on rank 0, in rank order; None elsewhere.

        `timeout_s` overrides the collective timeout (the ranks load at their own pace).
        """
        tensor = tensor.contiguous()
        if self._is_shared(tensor) and timeout_s is None:  # every rank sees every block; only rank 0 keeps them
            sent = 0 if self.is_driver else _nbytes(tensor)
            gathered = self._run_shared("gather", sent, lambda: self.exchange.all_gather(tensor, *self._shared_waits))
            return list(gathered.chunk(self.world_size)) if self.is_driver else None
        options = dist.GatherOptions()
        options.rootRank = 0
        options.timeout = self.timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        if self.is_driver:
            outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
            self._run("gather", 0, lambda: self.group.gather([outputs], [tensor], options))
            return outputs
        self._run("gather", _nbytes(tensor), lambda: self.group.gather([], [tensor], options))
        return None

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """Send `tensor` to rank `peer` (which receives it with `receive` into a tensor of the same shape and dtype)."""
        tensor = tensor.contiguous()
        self._run("send", _nbytes(tensor), lambda: self.group.send([tensor], peer, 0), self.timeout)

    def receive(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int) -> torch.Tensor:
        """The tensor rank `peer` sends next (of this shape and dtype)."""
        tensor = torch.empty(shape, dtype=dtype)
        self._run("receive", 0, lambda: self.group.recv([tensor], peer, 0), self.timeout)
        return tensor

    def broadcast_object(self, obj: object = None, timeout_s: float | None = None) -> object:
        """Rank 0's `obj` on every rank (pickled; tensors inside travel too). Others pass None.

        `timeout_s` overrides the collective timeout: workers idle between steps wait here.
        """
        timeout = self.timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        if self.is_driver:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        fanout = self.world_size - 1 if self.is_driver else 0
        self._run("broadcast", fanout * _nbytes(size), lambda: self.group.broadcast(size, 0, timeout))
        if not self.is_driver:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._run("broadcast", fanout * _nbytes(payload), lambda: self.group.broadcast(payload, 0, timeout))
        return obj if self.is_driver else pickle.loads(payload.numpy().tobytes())

    def _is_shared(self, tensor: torch.Tensor) -> bool:
        return self.exchange is not None and tensor.dtype == torch.float32

    @property
    def _shared_waits(self) -> tuple[float, Callable[[], str | None]]:
        return self.timeout.total_seconds(), self.peer_failure

    def _run_shared(self, kind: str, num_bytes: float, run: Callable[[], T]) -> T:
        """Run a collective through the shared segment, counted as `_run` counts gloo's."""
        began = time.perf_counter()
        try:
            result = run()
        except ExchangeFailed as error:
            raise CollectiveError(f"{kind} on rank {self.rank} of {self.world_size} failed: {error}") from error
        self.stats.record(kind, num_bytes, time.perf_counter() - began)
        return result

    def _run(self, kind: str, num_bytes: float, start, wait_timeout: datetime.timedelta | None = None) -> None:
        """Start a collective and wait for it; point-to-point calls take no options, so they bound the wait."""
        began = time.perf_counter()
        try:
            work = start()
            if wait_timeout is None:
                work.wait()
            else:
                work.wait(wait_timeout)
        except RuntimeError as error:
            raise CollectiveError(f"{kind} on rank {self.rank} of {self.world_size} failed: {error}") from error
        self.stats.record(kind, num_bytes, time.perf_counter() - began)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
