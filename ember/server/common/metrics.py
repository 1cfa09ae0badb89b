"""Prometheus metrics of one server, named like vLLM's under the `ember:` prefix.

Engine-wide numbers (running/waiting requests, KV-cache use, token and prefix-cache counters)
are read from `engine.stats()` at scrape time; per-request latencies are observed as requests
finish; the standard `process_*` metrics (resident memory, CPU, open files) describe the API process.
Everything lives in a per-app CollectorRegistry, so two servers in one process stay apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ember.engine.client import ReplicatedEngineClient
from ember.engine.llm_engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_TOKEN_INTERVAL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)


@dataclass
class FinishedRequest:
    """What the server learned about one request when it finished (no prompt text)."""

    request_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    time_to_first_token_s: float | None
    time_per_output_token_s: float | None
    latency_s: float


class _EngineCollector(Collector):
    """Reads the engine's live stats at every scrape: one series per metric, or with a data-parallel engine one per
    live replica (label `replica`), plus `ember:replica_up` and `ember:replica_restarts` for every replica."""

    def __init__(self, engine, model_name: str) -> None:
        self._engine = engine
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        if isinstance(self._engine, ReplicatedEngineClient):
            yield from self._replica_metrics(self._engine)
            samples = [([self._model_name, name], stats) for name, stats in self._engine.replica_stats().items()]
            yield from _engine_metrics(["model_name", "replica"], samples)
        else:
            yield from _engine_metrics(["model_name"], [([self._model_name], self._engine.stats())])

    def _replica_metrics(self, engine: ReplicatedEngineClient) -> Iterator[Metric]:
        up = GaugeMetricFamily("ember:replica_up", "1 while the replica's engine process runs, else 0.",
                               labels=["model_name", "replica"])
        restarts = CounterMetricFamily("ember:replica_restarts", "Times the replica's engine process was restarted.",
                                       labels=["model_name", "replica"])
        for health in engine.replica_health():
            up.add_metric([self._model_name, health.replica], float(health.is_up))
            restarts.add_metric([self._model_name, health.replica], float(health.restarts))
        yield up
        yield restarts


def _engine_metrics(label_names: list[str], samples: list[tuple[list[str], EngineStats]]) -> Iterator[Metric]:
    """The engine's gauges and counters, one series per (labels, stats) sample."""
    gauges = (
        ("ember:num_requests_running", "Requests in the engine's running batch.", "num_running"),
        ("ember:num_requests_waiting", "Requests waiting in the engine's queue.", "num_waiting"),
        ("ember:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1).", "kv_cache_usage"),
        ("ember:kv_cache_free_blocks", "KV-cache blocks free to allocate.", "num_free_blocks"),
        ("ember:kv_cache_total_blocks", "KV-cache blocks in the pool.", "num_total_blocks"),
        ("ember:num_threads", "CPU threads the latest engine step ran with (fewer while a neighbour takes cores).",
         "num_threads"),
        ("ember:spec_decode_acceptance_rate", "Share of drafted tokens the target kept.", "spec_acceptance_rate"),
        ("ember:spec_decode_mean_accepted_length", "Tokens emitted per verification (kept drafts + 1).",
         "spec_mean_accepted_length"),
    )
    counters = (
        ("ember:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
        ("ember:prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
        ("ember:num_preemptions", "Requests preempted to free KV-cache blocks.", "num_preemptions"),
        ("ember:num_slow_steps", "Engine steps many times slower than the median of their size (CPU contention).",
         "num_slow_steps"),
        ("ember:num_thread_changes", "Times the engine moved a step size to another CPU thread count.",
         "num_thread_changes"),
        ("ember:prompt_tokens", "Prompt tokens processed.", "prompt_tokens_total"),
        ("ember:generation_tokens", "Tokens generated.", "generation_tokens_total"),
        ("ember:spec_decode_num_draft_tokens", "Tokens drafted for speculative decoding (a Medusa tree counts its depth).",
         "spec_draft_tokens_total"),
        ("ember:spec_decode_num_accepted_tokens", "Drafted tokens the target kept.", "spec_accepted_tokens_total"),
        ("ember:spec_decode_num_verifications", "Sequence-steps that verified drafted tokens.", "spec_verifications_total"),
        ("ember:spec_decode_draft_time_seconds", "Time spent drafting.", "spec_draft_time_s"),
        ("ember:spec_decode_verify_time_seconds", "Time of target steps that verified drafts.", "spec_verify_time_s"),
    )
    for family, specs in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
        for name, documentation, attribute in specs:
            metric = family(name, documentation, labels=label_names)
            for labels, stats in samples:
                metric.add_metric(labels, float(getattr(stats, attribute)))
            yield metric


class ServerMetrics:
    """The metrics registry of one app and the per-request observations it records."""

    def __init__(self, engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._model_name = model_name
        self.registry.register(_EngineCollector(engine, model_name))
        # process_resident_memory_bytes and friends of this (the API) process, e.g. for soak tests.
        ProcessCollector(registry=self.registry)
        labels = ["model_name"]
        self._time_to_first_token = Histogram(
            "ember:time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._time_per_output_token = Histogram(
            "ember:time_per_output_token_seconds",
            "Mean time between generated tokens after the first, per request.",
            labels,
            buckets=_TOKEN_INTERVAL_BUCKETS_S,
            registry=self.registry,
        )
        self._e2e_latency = Histogram(
            "ember:e2e_request_latency_seconds",
            "Time from arrival to the last token.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._success = Counter(
            "ember:request_success",
            "Requests finished, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self._rejected = Counter(
            "ember:request_rejected_overload",
            "Requests answered 503 because the waiting queue was full.",
            labels,
            registry=self.registry,
        )

    def observe_finished(self, finished: FinishedRequest) -> None:
        """Record one finished request's latencies and finish reason."""
        if finished.time_to_first_token_s is not None:
            self._time_to_first_token.labels(self._model_name).observe(finished.time_to_first_token_s)
        if finished.time_per_output_token_s is not None:
            self._time_per_output_token.labels(self._model_name).observe(finished.time_per_output_token_s)
        self._e2e_latency.labels(self._model_name).observe(finished.latency_s)
        self._success.labels(self._model_name, finished.finish_reason).inc()

    def observe_rejected(self) -> None:
        """Record one request turned away by overload."""
        self._rejected.labels(self._model_name).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
