"""ember.gateway: one front door for many model servers.

A separate process (`ember gateway --config gateway.yaml --port P`) that speaks the OpenAI API to
clients and forwards each request to a backend: an `ember serve` replica, any OpenAI-compatible
server, or an Anthropic Messages server (translated both ways). It routes, retries, falls back,
caches, authenticates virtual keys, enforces budgets and rate limits from a shared store, and
exports metrics, traces and JSON logs.

It never imports `ember.engine` or torch: this package depends only on HTTP and storage libraries.
"""

from ember.gateway.config import GatewayConfig, load_config

__all__ = ["GatewayConfig", "load_config"]
