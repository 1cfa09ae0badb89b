"""The prefix-aware rule: which of several replicas of one model a prompt should go to first.

Consistent hashing of the prompt's first blocks onto a ring of replicas, so requests sharing a
prefix land where that prefix is already cached; a replica whose load (requests in flight) reaches
`load_factor` x the mean is passed over (consistent hashing with bounded loads). Removing a replica
moves only the prefixes that were its own.

Shared by the gateway (replicas are servers, prompts are text) and data-parallel serving (replicas
are engine processes behind one API, prompts are token ids): a leaf module on the bottom floor,
importing nothing of ember, so both may use it.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from typing import Protocol, TypeVar


class Replica(Protocol):
    """What the rule reads of a replica: a stable name (its place on the ring) and its load."""

    @property
    def name(self) -> str: ...

    @property
    def outstanding(self) -> int: ...


ReplicaT = TypeVar("ReplicaT", bound=Replica)


class PrefixAware:
    """Orders replicas for a prompt: its prefix's home on the ring first, unless full; every replica is returned,
    so a caller falls through the list when one fails.

    `block_size` is counted in the prompt's units (characters of a text, tokens of a list of token ids); the
    key is the hash of the first `num_blocks` full blocks (the whole prompt if shorter than one)."""

    def __init__(self, block_size: int, num_blocks: int, load_factor: float, virtual_nodes: int) -> None:
        self._block_size = block_size
        self._num_blocks = num_blocks
        self._load_factor = load_factor
        self._virtual_nodes = virtual_nodes

    def prefix_key(self, prompt: str | Sequence[int]) -> int:
        """The hash of the prompt's first `num_blocks` full blocks (the whole prompt if shorter)."""
        full_blocks = min(self._num_blocks, len(prompt) // self._block_size)
        prefix = prompt[: full_blocks * self._block_size] if full_blocks else prompt
        return _hash64(prefix if isinstance(prefix, str) else ",".join(map(str, prefix)))

    def order(self, candidates: Sequence[ReplicaT], prompt: str | Sequence[int]) -> list[ReplicaT]:
        """`candidates` in the order to try them for `prompt`."""
        ring = self._ring(candidates)
        start = bisect.bisect(ring, (self.prefix_key(prompt),))
        walk: list[ReplicaT] = []
        for offset in range(len(ring)):
            replica = ring[(start + offset) % len(ring)][1]
            if replica not in walk:
                walk.append(replica)
        total = sum(replica.outstanding for replica in candidates)
        capacity = math.ceil(self._load_factor * (total + 1) / len(candidates))
        under_bound = [replica for replica in walk if replica.outstanding < capacity]
        return under_bound + [replica for replica in walk if replica not in under_bound]

    def _ring(self, candidates: Sequence[ReplicaT]) -> list[tuple[int, ReplicaT]]:
        points = [
            (_hash64(f"{replica.name}#{virtual}"), index, replica)
            for index, replica in enumerate(candidates)
            for virtual in range(self._virtual_nodes)
        ]
        return [(point, replica) for point, _, replica in sorted(points, key=lambda item: item[:2])]


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")
