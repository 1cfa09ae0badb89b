"""What one run of a workload on one engine measured: per-request timings and the totals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ember.bench.stats import latency_summary


@dataclass
class RequestTiming:
    """One request's life on time.monotonic(): sent, first token, each token batch, done."""

    request_id: str
    role: str
    prompt_len: int
    output_tokens: int
    arrival: float
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)  # one entry per delta that carried tokens
    num_cached_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)  # the first sample's tokens (what a text-level check reads)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def latency_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    @property
    def inter_token_s(self) -> list[float]:
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token is None or self.finished is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass
class RunResult:
    """One timed pass of a workload through one engine configuration."""

    engine: str
    workload: str
    wall_s: float
    output_tokens: int
    requests: list[RequestTiming] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def ttfts(self, role: str | None = None) -> list[float]:
        return [r.ttft_s for r in self._of(role) if r.ttft_s is not None]

    def itls(self, role: str | None = None) -> list[float]:
        return [gap for r in self._of(role) for gap in r.inter_token_s]

    def _of(self, role: str | None) -> list[RequestTiming]:
        return [r for r in self.requests if role is None or r.role == role]

    def summary(self) -> dict:
        """The figures a report needs (no per-token lists)."""
        roles = sorted({r.role for r in self.requests})
        return {
            "engine": self.engine,
            "workload": self.workload,
            "wall_s": self.wall_s,
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "ttft": {role: latency_summary(self.ttfts(role)) for role in roles},
            "itl": {role: latency_summary(self.itls(role)) for role in roles},
            "extra": self.extra,
        }

    def to_dict(self) -> dict:
        return asdict(self)
