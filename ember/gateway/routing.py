"""Routing policies: given a model's live backends, the order in which to try them.

Every policy returns all candidates (the dispatcher falls through the list on failure); they
differ in who comes first:
- round_robin: each request starts one further along.
- least_outstanding: fewest requests in flight from this gateway first.
- latency_weighted: random, weighted by 1 / moving-average time to first byte.
- prefix_aware: consistent hashing of the prompt's first blocks onto a ring of replicas, so
  requests sharing a prefix land where that prefix is already cached; a replica whose load
  exceeds `load_factor` x the mean is passed over (consistent hashing with bounded loads).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import random
from typing import Protocol

from ember.gateway.backend_state import BackendState
from ember.gateway.config import PrefixRoutingConfig


class RoutingPolicy(Protocol):
    def order(self, candidates: list[BackendState], prompt_text: str) -> list[BackendState]:
        """`candidates` in the order they should be tried."""


class RoundRobin:
    def __init__(self) -> None:
        self._counter = itertools.count()

    def order(self, candidates: list[BackendState], prompt_text: str) -> list[BackendState]:
        start = next(self._counter) % len(candidates)
        return candidates[start:] + candidates[:start]


class LeastOutstanding:
    def __init__(self) -> None:
        self._tie_breaker = RoundRobin()

    def order(self, candidates: list[BackendState], prompt_text: str) -> list[BackendState]:
        rotated = self._tie_breaker.order(candidates, prompt_text)
        return sorted(rotated, key=lambda state: state.outstanding)  # stable: ties keep the rotation


class LatencyWeighted:
    """Backends never measured get the best known latency, so each is tried early."""

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def order(self, candidates: list[BackendState], prompt_text: str) -> list[BackendState]:
        known = [state.latency_ewma_s for state in candidates if state.latency_ewma_s is not None]
        default = min(known) if known else 1.0
        weights = {state.name: 1.0 / max(state.latency_ewma_s or default, 1e-4) for state in candidates}
        remaining = list(candidates)
        ordered = []
        while remaining:
            pick = self._random.choices(remaining, weights=[weights[state.name] for state in remaining])[0]
            remaining.remove(pick)
            ordered.append(pick)
        return ordered


class PrefixAware:
    def __init__(self, config: PrefixRoutingConfig) -> None:
        self._config = config

    def prefix_key(self, prompt_text: str) -> int:
        """The hash of the prompt's first `num_blocks` full blocks (the whole text if shorter)."""
        block = self._config.block_chars
        full_blocks = min(self._config.num_blocks, len(prompt_text) // block)
        prefix = prompt_text[: full_blocks * block] if full_blocks else prompt_text
        return _hash64(prefix)

    def order(self, candidates: list[BackendState], prompt_text: str) -> list[BackendState]:
        ring = self._ring(candidates)
        start = bisect.bisect(ring, (self.prefix_key(prompt_text),))
        walk = []
        for offset in range(len(ring)):
            state = ring[(start + offset) % len(ring)][1]
            if state not in walk:
                walk.append(state)
        total = sum(state.outstanding for state in candidates)
        capacity = math.ceil(self._config.load_factor * (total + 1) / len(candidates))
        under_bound = [state for state in walk if state.outstanding < capacity]
        return under_bound + [state for state in walk if state not in under_bound]

    def _ring(self, candidates: list[BackendState]) -> list[tuple[int, BackendState]]:
        points = [
            (_hash64(f"{state.name}#{replica}"), index, state)
            for index, state in enumerate(candidates)
            for replica in range(self._config.virtual_nodes)
        ]
        return [(point, state) for point, _, state in sorted(points, key=lambda item: item[:2])]


def make_policy(name: str, prefix_config: PrefixRoutingConfig) -> RoutingPolicy:
    """The policy called `name` (validated by the config)."""
    if name == "prefix_aware":
        return PrefixAware(prefix_config)
    return {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding, "latency_weighted": LatencyWeighted}[name]()


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")
