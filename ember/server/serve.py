"""Starting a server from Python: build the engine, log its KV-cache capacity, run uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from ember.server.app import build_app
from ember.server.config import ServerConfig

logger = logging.getLogger("ember.server")

GRACEFUL_SHUTDOWN_TIMEOUT_S = 5


def configure_logging(level: int = logging.INFO) -> None:
    """Send ember's log lines (including the per-request lines) to stderr, once."""
    ember_logger = logging.getLogger("ember")
    if not ember_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        ember_logger.addHandler(handler)
    ember_logger.setLevel(level)
    ember_logger.propagate = False


def describe_capacity(engine) -> str:
    """One line on the KV cache: blocks, tokens and bytes."""
    stats = engine.stats()
    num_tokens = stats.num_total_blocks * stats.block_size
    return (
        f"KV cache: {stats.num_total_blocks} blocks x {stats.block_size} tokens = {num_tokens} tokens, "
        f"{stats.kv_cache_bytes / 2**20:.1f} MiB; context window {engine.max_model_len} tokens"
    )


def serve_app(engine, server_config: ServerConfig) -> None:
    """Serve an already-built engine until interrupted (the caller shuts the engine down)."""
    app = build_app(engine, server_config)
    uvicorn_config = uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT_S,
    )
    logger.info(
        "serving %s on http://%s:%d/v1",
        ", ".join(app.state.context.model_names),
        server_config.host,
        server_config.port,
    )
    uvicorn.Server(uvicorn_config).run()


def run_server(engine_config, server_config: ServerConfig | None = None) -> None:
    """Start the engine process for `engine_config` (it loads with a progress bar), then serve until stopped."""
    from ember.engine.process_client import EngineProcessClient

    server_config = server_config or ServerConfig()
    configure_logging()
    engine = EngineProcessClient(engine_config)
    try:
        logger.info(describe_capacity(engine))
        serve_app(engine, server_config)
    finally:
        engine.shutdown()
