"""Routing policies: given a model's live backends, the order in which to try them.

Every policy returns all candidates (the dispatcher falls through the list on failure); they
differ in who comes first:
- round_robin: each request starts one further along.
- least_outstanding: fewest requests in flight from this gateway first.
- latency_weighted: random, weighted by 1 / moving-average time to first byte.
- prefix_aware: consistent hashing of the prompt's first blocks onto a ring of replicas, so
  requests sharing a prefix land where that prefix is already cached; a replica whose load
  exceeds `load_factor` x the mean is passed over (consistent hashing with bounded loads).
  The rule is `ember.prefix_routing`'s, shared with data-parallel serving.
"""

from __future__ import annotations

import itertools
import random
from typing import Protocol

from ember.gateway.backend_state import BackendState
from ember.gateway.config import PrefixRoutingConfig
from ember.prefix_routing import PrefixAware


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


def prefix_aware(config: PrefixRoutingConfig) -> PrefixAware:
    """The prefix-aware rule with the gateway's settings (blocks of `block_chars` characters of the prompt)."""
    return PrefixAware(config.block_chars, config.num_blocks, config.load_factor, config.virtual_nodes)


def make_policy(name: str, prefix_config: PrefixRoutingConfig) -> RoutingPolicy:
    """The policy called `name` (validated by the config)."""
    if name == "prefix_aware":
        return prefix_aware(prefix_config)
    return {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding, "latency_weighted": LatencyWeighted}[name]()
