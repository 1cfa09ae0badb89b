"""What one gateway knows about each backend right now: load, latency, and its circuit breaker."""

from __future__ import annotations

import dataclasses

from ember.gateway.config import BreakerConfig

LATENCY_EWMA_WEIGHT = 0.2


@dataclasses.dataclass
class CircuitBreaker:
    """Closed while a backend works; opens after `failure_threshold` failures in a row and stays
    open for `cooldown_s`; then lets requests through again (half-open): one more failure
    re-opens it at once, one success closes it."""

    config: BreakerConfig
    consecutive_failures: int = 0
    open_until_s: float = 0.0

    def is_open(self, now_s: float) -> bool:
        """Whether the backend should be skipped at `now_s`."""
        return now_s < self.open_until_s

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.open_until_s = 0.0

    def record_failure(self, now_s: float) -> None:
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.config.failure_threshold:
            self.open_until_s = now_s + self.config.cooldown_s


@dataclasses.dataclass
class BackendState:
    """Live numbers of one backend as this gateway sees them (never shared between replicas)."""

    name: str
    breaker: CircuitBreaker
    outstanding: int = 0
    latency_ewma_s: float | None = None

    def observe_latency(self, seconds: float) -> None:
        """Fold a time-to-first-byte observation into the moving average."""
        if self.latency_ewma_s is None:
            self.latency_ewma_s = seconds
        else:
            self.latency_ewma_s += LATENCY_EWMA_WEIGHT * (seconds - self.latency_ewma_s)
