"""Rendezvous: the ranks meet at a TCP store (rank 0 hosts it) and form one gloo process group.

torchrun-style: every rank knows the master address and port, its rank and the world size.
The group is built directly (no `init_process_group`), so nothing global is set and a second
engine in the same process gets its own group. Then rank 0 offers a shared memory segment
(ember.parallel.shared_exchange) through the store; the group uses it when every rank could
map it and read rank 0's token from it (all ranks on this machine), and gloo alone otherwise.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import socket
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from ember.parallel.communicator import Communicator
from ember.parallel.shared_exchange import (
    SharedExchange,
    exchange_library,
    new_segment_path,
    new_token,
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def connect(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float, startup_timeout_s: float,
    peer_failure: Callable[[], str | None] = lambda: None,
) -> Communicator:
    """Join the group as `rank`; returns once every rank has arrived (or raises after `startup_timeout_s`).

    `peer_failure` says what is known wrong with a peer (rank 0 watches its worker processes)."""
    startup = datetime.timedelta(seconds=startup_timeout_s)
    store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=startup, wait_for_workers=False)
    # Wait for every rank first: gloo's own connect would time out on a rank still importing torch.
    store.set(f"ember/arrived/{rank}", "1")
    store.wait([f"ember/arrived/{r}" for r in range(world_size)], startup)
    group = dist.ProcessGroupGloo(dist.PrefixStore("ember/gloo", store), rank, world_size, _gloo_options(master_addr, startup))
    exchange = _shared_exchange(store, rank, world_size, startup)
    return Communicator(group, rank, world_size, timeout_s, store, exchange, peer_failure)


def subgroup(world: Communicator, ranks: range, startup_timeout_s: float) -> Communicator:
    """A communicator among `ranks` of `world` (this rank one of them, numbered by its place in `ranks`), met on the
    world's store: a pipeline stage's tensor-parallel group, with a shared segment of its own where its ranks share
    a machine. Every rank of `ranks` calls it at once."""
    if world.store is None:
        raise ValueError("a subgroup meets on its world's store; this communicator has none")
    startup = datetime.timedelta(seconds=startup_timeout_s)
    rank = ranks.index(world.rank)
    store = dist.PrefixStore(f"ember/ranks-{ranks.start}-{ranks.stop}", world.store)
    group = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, len(ranks), _gloo_options(world.store.host, startup))
    exchange = _shared_exchange(store, rank, len(ranks), startup)
    communicator = Communicator(group, rank, len(ranks), world.timeout.total_seconds(), world.store, exchange, world.peer_failure)
    communicator.stats = world.stats  # one count of everything this rank sends, whichever group carried it
    return communicator


def _gloo_options(master_addr: str, timeout: datetime.timedelta) -> dist.ProcessGroupGloo._Options:
    """gloo's options: its TCP device on this machine's address towards `master_addr`, unless GLOO_SOCKET_IFNAME
    names an interface. gloo's default device is the address the host name resolves to, else loopback: on a node
    whose host name does not resolve to a routable address (measured in a network namespace: it fell back to
    127.0.0.1), the other node's ranks were told to connect to their own loopback and the group never formed."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        options._devices = [dist.ProcessGroupGloo.create_device(interface=name) for name in interface.split(",")]
    else:
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address_towards(master_addr))]
    return options


def local_address_towards(address: str) -> str:
    """The address of this machine's interface that packets to `address` leave from (no packet is sent: a UDP
    socket's connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        return probe.getsockname()[0]


def _shared_exchange(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> SharedExchange | None:
    """The group's shared segment if every rank maps it (every rank gets the same answer), else None."""
    library = exchange_library()
    path = None
    if rank == 0:
        path = new_segment_path() if library is not None else None
        exchange = offer_segment(store, path, world_size, library)
    else:
        exchange = map_offered_segment(store, rank, world_size, library)
    store.set(f"ember/shared/mapped/{rank}", "1" if exchange is not None else "0")
    keys = [f"ember/shared/mapped/{r}" for r in range(world_size)]
    store.wait(keys, timeout)
    if path is not None:
        path.unlink(missing_ok=True)  # every rank has it mapped (or never will): the name is no longer needed
    return exchange if all(store.get(key) == b"1" for key in keys) else None


def offer_segment(
    store: dist.Store, path: Path | None, world_size: int, library: ctypes.CDLL | None
) -> SharedExchange | None:
    """Rank 0: create the segment at `path` with a fresh token in it, and tell the others where it is ("": nowhere)."""
    token = new_token()
    try:
        exchange = None if path is None else SharedExchange(path, 0, world_size, library, create=True)
    except OSError:
        exchange = None
    if exchange is not None:
        exchange.write_token(token)
    store.set("ember/shared/path", str(path) if exchange is not None else "")
    store.set("ember/shared/token", token.hex())
    return exchange


def map_offered_segment(
    store: dist.Store, rank: int, world_size: int, library: ctypes.CDLL | None
) -> SharedExchange | None:
    """A worker: map the segment rank 0 offers, if it can and it holds rank 0's token (the same machine's)."""
    offered = store.get("ember/shared/path").decode()
    token = bytes.fromhex(store.get("ember/shared/token").decode())
    if not offered or library is None:
        return None
    try:
        exchange = SharedExchange(Path(offered), rank, world_size, library, create=False)
    except OSError:
        return None
    return exchange if exchange.token == token else None
