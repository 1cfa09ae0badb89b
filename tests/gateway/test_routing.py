"""Routing policies on tiny fixed backend sets: exact orders, prefix affinity, bounded loads."""

from __future__ import annotations

from ember.gateway.backend_state import BackendState, CircuitBreaker
from ember.gateway.config import BreakerConfig, PrefixRoutingConfig
from ember.gateway.routing import LatencyWeighted, LeastOutstanding, RoundRobin, prefix_aware


def states(*names: str) -> list[BackendState]:
    return [BackendState(name, CircuitBreaker(BreakerConfig())) for name in names]


def names(ordered: list[BackendState]) -> list[str]:
    return [state.name for state in ordered]


def test_round_robin_starts_one_further_each_time():
    policy, backends = RoundRobin(), states("a", "b", "c")
    assert [names(policy.order(backends, ""))[0] for _ in range(4)] == ["a", "b", "c", "a"]
    assert names(policy.order(backends, "")) == ["b", "c", "a"]


def test_least_outstanding_puts_the_idlest_first():
    backends = states("a", "b", "c")
    backends[0].outstanding, backends[1].outstanding, backends[2].outstanding = 3, 0, 1
    assert names(LeastOutstanding().order(backends, "")) == ["b", "c", "a"]


def test_latency_weighted_prefers_the_fast_backend():
    backends = states("fast", "slow")
    backends[0].observe_latency(0.01)
    backends[1].observe_latency(1.0)
    policy = LatencyWeighted(seed=0)
    firsts = [names(policy.order(backends, ""))[0] for _ in range(200)]
    assert firsts.count("fast") > 180


def test_breaker_opens_after_threshold_and_closes_on_success():
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2, cooldown_s=5))
    breaker.record_failure(now_s=0)
    assert not breaker.is_open(0)
    breaker.record_failure(now_s=1)
    assert breaker.is_open(5.9) and not breaker.is_open(6.0)
    breaker.record_failure(now_s=6.5)  # half-open: one more failure re-opens at once
    assert breaker.is_open(7)
    breaker.record_success()
    assert not breaker.is_open(7)


SYSTEM = "You are a helpful assistant that answers questions about the ember project. " * 8


def test_prefix_aware_sends_a_shared_prefix_to_one_replica():
    policy, backends = prefix_aware(PrefixRoutingConfig(block_chars=64, num_blocks=4)), states("r0", "r1", "r2")
    firsts = {names(policy.order(backends, SYSTEM + f"question {index}"))[0] for index in range(20)}
    assert len(firsts) == 1
    spread = {names(policy.order(backends, f"{index} " + SYSTEM))[0] for index in range(60)}
    assert spread == {"r0", "r1", "r2"}


def test_prefix_aware_moves_only_the_removed_replicas_prefixes():
    policy, backends = prefix_aware(PrefixRoutingConfig(block_chars=8, num_blocks=2)), states("r0", "r1", "r2")
    prompts = [f"prefix-{index:04d}-rest" for index in range(300)]
    before = {prompt: names(policy.order(backends, prompt))[0] for prompt in prompts}
    after = {prompt: names(policy.order(backends[:2], prompt))[0] for prompt in prompts}
    moved = [prompt for prompt in prompts if before[prompt] != after[prompt]]
    assert moved and all(before[prompt] == "r2" for prompt in moved)


def test_prefix_aware_passes_over_a_replica_above_the_load_bound():
    policy, backends = prefix_aware(PrefixRoutingConfig(block_chars=64, num_blocks=4, load_factor=1.25)), states("r0", "r1")
    home = names(policy.order(backends, SYSTEM))[0]
    busy = next(state for state in backends if state.name == home)
    busy.outstanding = 4  # bound: ceil(1.25 * (4 + 1) / 2) = 4, so the home replica is full
    assert names(policy.order(backends, SYSTEM))[0] != home
    busy.outstanding = 3  # bound: ceil(1.25 * 4 / 2) = 3: still full
    assert names(policy.order(backends, SYSTEM))[0] != home
    busy.outstanding = 2  # bound: ceil(1.25 * 3 / 2) = 2: full
    assert names(policy.order(backends, SYSTEM))[0] != home
    busy.outstanding = 1  # bound: ceil(1.25 * 2 / 2) = 2: room again
    assert names(policy.order(backends, SYSTEM))[0] == home
