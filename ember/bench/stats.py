"""Small statistics every benchmark shares: percentiles, repeat summaries, ratios."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return float(ordered[low])
    fraction = position - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return float(sum(values)) / len(values)


@dataclass(frozen=True)
class Spread:
    """Median and range of a measurement repeated `len(values)` times."""

    median: float
    min: float
    max: float
    values: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "values": list(self.values)}

    @classmethod
    def from_dict(cls, data: dict) -> Spread:
        return cls(data["median"], data["min"], data["max"], tuple(data["values"]))


def spread(values: Sequence[float]) -> Spread:
    """Median, min and max of repeated measurements."""
    if not values:
        raise ValueError("spread of no measurement")
    return Spread(percentile(values, 50.0), float(min(values)), float(max(values)), tuple(float(v) for v in values))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def latency_summary(values_s: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p90, p99 and max of latencies, in milliseconds."""
    if not values_s:
        return {"count": 0}
    ms = [v * 1000.0 for v in values_s]
    return {
        "count": len(ms),
        "mean_ms": mean(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
    }
