"""Starting a server from Python: build the engine, log its KV-cache capacity, run uvicorn."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import socket
import sys
from types import FrameType

import uvicorn

from ember.server.app import build_app
from ember.server.common.drain import Drain
from ember.server.common.header_timeout import HeaderDeadlineProtocol
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


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM or Ctrl+C drains the app (see `ember.server.common.drain`)
    before it stops; a second one cuts the grace period short (the streams still open end at once
    with an error event and `[DONE]`, and the process exits 0); a third stops it as uvicorn would."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self.should_exit or self._drain.is_cut_short:
            super().handle_exit(sig, frame)
            return
        # Runs in the signal handler: the drain runs on the loop and ends by asking uvicorn to stop.
        if self._drain.is_draining:
            self._drain.cut_short()
            return
        self._drain.start()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain.run()
        finally:
            self.should_exit = True


def uvicorn_config(app, server_config: ServerConfig, log_level: str = "info") -> uvicorn.Config:
    """How uvicorn serves `app`: address, the header deadline, no access log."""
    return uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        http=functools.partial(HeaderDeadlineProtocol, header_timeout_s=server_config.header_timeout_s),
        # One idle rule: the header deadline also ends a silent keep-alive connection, so uvicorn's own (5 s by
        # default) does not close connections a loaded client is about to reuse (a burst's POSTs then read EOF).
        timeout_keep_alive=math.ceil(server_config.header_timeout_s),
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT_S,
    )


# The API process's event loop shares the GIL with the tokenizer worker (and the engine client's reader): with
# Python's default 5 ms switch interval, a large batch being tokenized held /health for 0.3-1 s (median 0.3 s over
# four 256-prompt batches, tests/server/test_serve_pressure.py); at 0.5 ms the loop gets the GIL back in time.
API_PROCESS_SWITCH_INTERVAL_S = 0.0005


def serve_app(engine, server_config: ServerConfig) -> None:
    """Serve an already-built engine until interrupted (the caller shuts the engine down). Sets this process's GIL
    switch interval (`API_PROCESS_SWITCH_INTERVAL_S`): the process is the server's."""
    sys.setswitchinterval(API_PROCESS_SWITCH_INTERVAL_S)
    app = build_app(engine, server_config)
    server = DrainingServer(uvicorn_config(app, server_config, server_config.uvicorn_log_level), app.state.context.drain)
    logger.info(
        "serving %s on http://%s:%d/v1",
        ", ".join(app.state.context.model_names),
        server_config.host,
        server_config.port,
    )
    server.run()


def run_server(engine_config, server_config: ServerConfig | None = None) -> None:
    """Start the engine process for `engine_config` (it loads with a progress bar), or `data_parallel.size` of them
    behind one API, then serve until stopped."""
    from ember.engine.data_parallel import DataParallelEngine
    from ember.engine.process_client import EngineProcessClient

    server_config = server_config or ServerConfig()
    configure_logging()
    if server_config.data_parallel.is_replicated:
        engine = DataParallelEngine(engine_config, server_config.data_parallel)
    else:
        engine = EngineProcessClient(engine_config)
    try:
        logger.info(describe_capacity(engine))
        serve_app(engine, server_config)
    finally:
        engine.shutdown()
