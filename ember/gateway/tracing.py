"""OpenTelemetry traces: one span per request, one child per backend attempt.

Each app has its own TracerProvider (never the global one), so two gateways in one process
export separately. Exporters: none, console, memory (tests read `GatewayTracing.memory`).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class GatewayTracing:
    def __init__(self, exporter: str) -> None:
        self.provider = TracerProvider()
        self.memory: InMemorySpanExporter | None = None
        if exporter == "memory":
            self.memory = InMemorySpanExporter()
            self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        elif exporter == "console":
            self.provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        self.tracer = self.provider.get_tracer("ember.gateway")

    def shutdown(self) -> None:
        self.provider.shutdown()
