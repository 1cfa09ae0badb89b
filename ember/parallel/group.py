"""Rendezvous: the ranks meet at a TCP store (rank 0 hosts it) and form one gloo process group.

torchrun-style: every rank knows the master address and port, its rank and the world size.
The group is built directly (no `init_process_group`), so nothing global is set and a second
engine in the same process gets its own group.
"""

from __future__ import annotations

import datetime
import socket

import torch.distributed as dist

from ember.parallel.communicator import Communicator


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def connect(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float, startup_timeout_s: float
) -> Communicator:
    """Join the group as `rank`; returns once every rank has arrived (or raises after `startup_timeout_s`)."""
    startup = datetime.timedelta(seconds=startup_timeout_s)
    store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=startup, wait_for_workers=False)
    # Wait for every rank first: gloo's own connect would time out on a rank still importing torch.
    store.set(f"ember/arrived/{rank}", "1")
    store.wait([f"ember/arrived/{r}" for r in range(world_size)], startup)
    group = dist.ProcessGroupGloo(dist.PrefixStore("ember/gloo", store), rank, world_size, startup)
    return Communicator(group, rank, world_size, timeout_s, store)
