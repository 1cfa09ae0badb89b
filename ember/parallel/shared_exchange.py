"""SharedExchange: the collectives of ranks on one machine through one shared memory segment.

gloo's TCP collectives cost about 1.3 ms each on a small VM (measured: an all-reduce of one
576-float row), and a tensor-parallel decode step runs two per layer: 61 per step for
SmolLM2, so talking took eight times longer than computing. Ranks that share a machine instead
map one segment: each exchange, every rank copies its data into its own slot and publishes the
exchange's number (ember/parallel/csrc/shared_exchange.c: a release store, read with acquire
loads); once all have published, each rank reads every slot. An all-reduce sums the slots in
rank order, so every rank gets the same bits (for two ranks, the same a + b gloo adds); an
all-gather stacks them. Slots come in two sets used by alternate exchanges: a rank can only
start writing exchange n + 2 after every rank published n + 1, that is after each finished
reading n. Tensors larger than a slot go in slot-sized pieces, one exchange each.

Rank 0 creates the segment as a file under /dev/shm and unlinks it once every rank has mapped it,
so nothing outlives the group. Ranks on different machines (or a machine without /dev/shm, or
without a C compiler) fail to open it and the group keeps gloo for everything.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ember.native_build import build_shared_library

SHARED_FOLDER = Path("/dev/shm")
SOURCE_PATH = Path(__file__).parent / "csrc" / "shared_exchange.c"
HEADER_BYTES = 4096  # the ranks' exchange numbers, one cache line each (up to 64 ranks)
TOKEN_BYTES = 16  # rank 0's random token, right after the numbers' lines: proves a rank opened the right segment
SLOT_BYTES = 1 << 20  # per rank and set: a 1 MiB piece (a prefill chunk of 455 rows of 576 floats)
WAIT_SLICE_S = 0.05  # how long the C wait runs before Python checks the deadline and the peers again


class ExchangeFailed(RuntimeError):
    """A rank did not publish an exchange in time, or a peer is known dead (`rank`: the first one missing)."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


class SharedExchange:
    """One rank's view of the group's shared segment; float32 all-reduce and all-gather through it."""

    def __init__(self, path: Path, rank: int, world_size: int, library: ctypes.CDLL, create: bool) -> None:
        """Map the segment at `path` (rank 0 `create`s it, of the size `world_size` needs)."""
        size = HEADER_BYTES + 2 * world_size * SLOT_BYTES
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        descriptor = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(descriptor, size)
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._address = self._bytes.data_ptr()
        self._publish = library.ember_shared_publish
        self._publish.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64]
        self._wait = library.ember_shared_wait
        self._wait.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double]
        self._wait.restype = ctypes.c_int64
        self.rank = rank
        self.world_size = world_size
        self.number = 0  # of the last exchange this rank took part in

    @property
    def token(self) -> bytes:
        return self._map[HEADER_BYTES - TOKEN_BYTES : HEADER_BYTES]

    def write_token(self, token: bytes) -> None:
        self._map[HEADER_BYTES - TOKEN_BYTES : HEADER_BYTES] = token

    def all_reduce(self, tensor: torch.Tensor, timeout_s: float, peer_failure: Callable[[], str | None]) -> None:
        """Sum float32 `tensor` (contiguous) over the ranks, in place."""
        flat = tensor.view(-1)
        for start in range(0, flat.numel(), self.slot_floats):
            piece = flat[start : start + self.slot_floats]
            piece.copy_(self._exchange(piece, timeout_s, peer_failure).sum(dim=0))

    def all_gather(self, block: torch.Tensor, timeout_s: float, peer_failure: Callable[[], str | None]) -> torch.Tensor:
        """Every rank's float32 `block` (same shape everywhere) stacked along rows, in rank order."""
        flat = block.contiguous().view(-1)
        gathered = torch.empty(self.world_size, flat.numel(), dtype=flat.dtype)
        for start in range(0, flat.numel(), self.slot_floats):
            piece = flat[start : start + self.slot_floats]
            gathered[:, start : start + piece.numel()] = self._exchange(piece, timeout_s, peer_failure)
        return gathered.view(self.world_size * block.shape[0], *block.shape[1:])

    @property
    def slot_floats(self) -> int:
        return SLOT_BYTES // 4

    def _exchange(self, piece: torch.Tensor, timeout_s: float, peer_failure: Callable[[], str | None]) -> torch.Tensor:
        """Every rank's `piece` (at most one slot of float32), as a [world_size, n] view valid until the next exchange."""
        self.number += 1
        slots = self._slots(self.number % 2)
        slots[self.rank, : piece.numel()] = piece
        self._publish(self._address, self.rank, self.number)
        deadline = time.monotonic() + timeout_s
        while (missing := self._wait(self._address, self.world_size, self.number, WAIT_SLICE_S)) != 0:
            failure = peer_failure()
            if failure is not None:
                raise ExchangeFailed(failure, missing - 1)
            if time.monotonic() > deadline:
                raise ExchangeFailed(f"rank {missing - 1} did not take part within {timeout_s:g} s", missing - 1)
        return slots[:, : piece.numel()]

    def _slots(self, which: int) -> torch.Tensor:
        start = HEADER_BYTES + which * self.world_size * SLOT_BYTES
        return self._bytes[start : start + self.world_size * SLOT_BYTES].view(torch.float32).view(self.world_size, -1)


def exchange_library() -> ctypes.CDLL | None:
    """The publish / wait functions, built on first use; None without a compiler."""
    path = build_shared_library("ember_shared_exchange", SOURCE_PATH.read_text())
    return None if path is None else ctypes.CDLL(str(path))


def new_segment_path() -> Path | None:
    """Where rank 0 creates the segment; None where this machine has no shared memory folder."""
    return SHARED_FOLDER / f"ember-{os.getpid()}-{secrets.token_hex(8)}" if SHARED_FOLDER.is_dir() else None


def new_token() -> bytes:
    return secrets.token_bytes(TOKEN_BYTES)
