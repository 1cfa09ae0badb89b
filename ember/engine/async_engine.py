"""AsyncEngine: the engine's step loop on a background thread, streaming deltas to asyncio consumers.

An EngineClient for tests and for embedding an engine in an asyncio program. `ember serve` runs
EngineProcessClient instead: on CPU a step loop off the main thread decodes at about half speed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ember.engine.client import EngineDeadError
from ember.engine.config import EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import EngineStats, LLMEngine, StepRecord
from ember.engine.outputs import RequestOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Abort:
    request_id: str


class _Stream:
    """Where one request's deltas go: an asyncio queue fed from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncEngine:
    """One LLMEngine shared by many concurrent requests (continuous batching across callers).

    Only the engine thread touches the LLMEngine; callers talk to it through a command queue,
    and read `stats()` / `step_records()` from a snapshot refreshed after every step.
    """

    def __init__(self, config: EngineConfig, show_progress: bool = True) -> None:
        self.engine = LLMEngine(config, show_progress=show_progress)
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self.limits = self.engine.limits
        self._commands: queue.SimpleQueue[EngineRequest | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._stats = self.engine.stats()
        self._records: list[StepRecord] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ember-engine", daemon=True)
        self._thread.start()

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Check `request` now (RequestRejected, EngineDeadError), then stream its deltas (EngineClient.generate)."""
        self.limits.check(request)
        if self._stopped.is_set():
            raise EngineDeadError("the engine has been shut down")
        return self._stream(request)

    async def _stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        request_id = request.request_id
        stream = _Stream(asyncio.get_running_loop())
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
        self._commands.put(request)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            with self._streams_lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Ask the engine to drop a request and free its blocks (thread-safe, idempotent)."""
        self._commands.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def dead_reason(self) -> str | None:
        """Why the engine stopped, or None while it runs."""
        return "the engine was shut down" if self._stopped.is_set() else None

    def step_records(self) -> list[StepRecord]:
        return list(self._records)

    def shutdown(self) -> None:
        self._stopped.set()
        self._commands.put(None)
        self._thread.join(timeout=30)

    # -- engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._apply_commands(block=not self.engine.has_unfinished_requests())
            if self._stopped.is_set():
                break
            try:
                outputs = self.engine.step()
            except Exception as error:  # a failed step fails its requests, never the thread
                logger.exception("engine step failed")
                self._fail_all(error)
                continue
            for output in outputs:
                self._deliver(output)
            self._stats = self.engine.stats()
            self._records = self.engine.step_records()[-1024:]

    def _apply_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while command is not None:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
        self._stopped.set()

    def _apply(self, command: EngineRequest | _Abort) -> None:
        if isinstance(command, _Abort):
            self.engine.abort_request(command.request_id)
            return
        try:
            self.engine.add_checked_request(command)
        except ValueError as error:
            self._deliver_error(command.request_id, error)

    def _deliver(self, output: RequestOutput) -> None:
        with self._streams_lock:
            stream = self._streams.get(output.request_id)
        if stream is not None:
            stream.put(output)

    def _deliver_error(self, request_id: str, error: BaseException) -> None:
        with self._streams_lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            stream.put(error)

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            self._deliver_error(request_id, RuntimeError(f"the engine failed while running this request: {error}"))
        self.engine.step()  # drain the abort outputs so nothing lingers
