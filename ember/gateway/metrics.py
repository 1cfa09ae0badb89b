"""Prometheus metrics of one gateway, per backend, key and model (a registry per app)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

__all__ = ["CONTENT_TYPE", "GatewayMetrics"]


class GatewayMetrics:
    """Counters and histograms the request path updates; gauges read live backend state."""

    def __init__(self, backend_states: dict, is_cooling_down: Callable[[str], bool]) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("ember_gateway_requests", "Client requests by outcome.", ["model", "key", "status"], registry=registry)
        self.attempts = Counter("ember_gateway_backend_attempts", "Backend attempts by outcome.", ["backend", "outcome"], registry=registry)
        self.tokens = Counter("ember_gateway_tokens", "Tokens billed.", ["model", "key", "kind"], registry=registry)
        self.spend = Counter("ember_gateway_spend_nano_usd", "Money billed, nano-USD.", ["model", "key"], registry=registry)
        self.latency = Histogram("ember_gateway_request_seconds", "Request latency.", ["model"], buckets=LATENCY_BUCKETS_S, registry=registry)
        self.ttft = Histogram("ember_gateway_ttft_seconds", "Time to first streamed token.", ["model"], buckets=LATENCY_BUCKETS_S, registry=registry)
        self.cache_lookups = Counter("ember_gateway_cache_lookups", "Semantic cache lookups.", ["model", "result"], registry=registry)
        self.cache_saved_tokens = Counter("ember_gateway_cache_saved_tokens", "Tokens served from the cache.", ["model"], registry=registry)
        self.rejections = Counter("ember_gateway_rejections", "Requests refused before dispatch.", ["key", "code"], registry=registry)
        outstanding = Gauge("ember_gateway_backend_outstanding", "Requests in flight per backend.", ["backend"], registry=registry)
        breaker_open = Gauge("ember_gateway_backend_breaker_open", "1 while a backend cools down.", ["backend"], registry=registry)
        for name, state in backend_states.items():
            outstanding.labels(name).set_function(lambda state=state: state.outstanding)
            breaker_open.labels(name).set_function(lambda name=name: float(is_cooling_down(name)))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
