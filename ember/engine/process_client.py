"""EngineProcessClient: an EngineClient whose engine runs in its own process (what `ember serve` uses).

The client starts the engine process (spawned: a fresh interpreter, its own OpenMP runtime),
waits until it has loaded, and loads the same tokenizer on this side, so prompts are tokenized
and validated here while the engine only steps. A daemon thread sends commands (so the event loop
never blocks on a full pipe); the callers' event loop reads the step outputs itself (a reader on
their own pipe, cut into messages by `FrameReader`) and puts each delta straight into its
request's asyncio queue: no thread hop and no loop wake-up in between, which on a 2-core machine
cost the engine's threads measurable time per token. A second daemon thread waits for the engine process to exit: when it dies, every open stream
ends with EngineDeadError (after the deltas it sent before dying), new requests get it at once,
and `dead_reason` says why, whether or not a request was running.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ember.engine.builder import load_tokenizer_from
from ember.engine.client import EngineDeadError
from ember.engine.config import EngineConfig
from ember.engine.engine_process import run_engine_process
from ember.engine.engine_request import EngineRequest
from ember.engine.frames import FrameReader
from ember.engine.llm_engine import EngineStats, StepRecord
from ember.engine.messages import (
    AbortRequest,
    AddRequest,
    EngineFailed,
    EngineReady,
    FromEngine,
    RequestFailed,
    Shutdown,
    StepOutputs,
    ToEngine,
)
from ember.engine.outputs import RequestOutput

logger = logging.getLogger(__name__)

STEP_RECORDS_KEPT = 1024
SHUTDOWN_TIMEOUT_S = 30.0


@dataclass
class _Stream:
    """One request's prompt (deltas arrive without it) and the queue its deltas go to."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt_token_ids: list[int]
    prompt: str | None

    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand `item` to the stream from any thread."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class EngineProcessClient:
    """Starts an engine process for `config` and streams requests through it; `cpu_cores`: the only cores the
    process (and the ranks it starts) may run on (None: this process's)."""

    def __init__(self, config: EngineConfig, show_progress: bool = True, startup_timeout_s: float | None = None,
                 cpu_cores: frozenset[int] | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        # One pipe each way: the outputs' read end is non-blocking (the loop reads it), the commands' stays blocking.
        commands_in, self._commands = context.Pipe(duplex=False)
        self._outputs, outputs_out = context.Pipe(duplex=False)
        self._process = context.Process(
            target=run_engine_process, args=(config, commands_in, outputs_out, show_progress, cpu_cores), name="ember-engine",
            daemon=True,
        )
        self._process.start()
        commands_in.close()  # only the child holds these ends now, so its death reads as end-of-file here
        outputs_out.close()
        ready = self._wait_until_ready(startup_timeout_s)
        os.set_blocking(self._outputs.fileno(), False)
        self._frames = FrameReader(self._outputs.fileno())
        self.model_name = ready.model_name
        self.max_model_len = ready.max_model_len
        self.limits = ready.limits
        self.tokenizer = load_tokenizer_from(ready.tokenizer_source)
        self._stats = ready.stats
        self._records: collections.deque[StepRecord] = collections.deque(maxlen=STEP_RECORDS_KEPT)
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._dead_reason: str | None = None
        self._outbox: queue.SimpleQueue[ToEngine | None] = queue.SimpleQueue()
        self._reader_loop: asyncio.AbstractEventLoop | None = None  # the loop that reads the pipe (the callers')
        self._pipe_closed = False
        self._sender = threading.Thread(target=self._send_loop, name="ember-engine-sender", daemon=True)
        self._watcher = threading.Thread(target=self._watch_process, name="ember-engine-watcher", daemon=True)
        self._sender.start()
        self._watcher.start()

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The engine process's id."""
        return self._process.pid

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Check `request` here, with the engine's limits (RequestRejected, EngineDeadError), then stream it."""
        self.limits.check(request)
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        return self._stream(request)

    async def _stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        request_id = request.request_id
        loop = asyncio.get_running_loop()
        self._read_on(loop)
        stream = _Stream(loop, asyncio.Queue(), request.prompt_token_ids, request.prompt)
        with self._lock:
            if self._dead_reason is not None:
                raise EngineDeadError(self._dead_reason)
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
        self._outbox.put(AddRequest(request))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._outbox.put(AbortRequest(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def step_records(self) -> list[StepRecord]:
        return list(self._records)

    def shutdown(self) -> None:
        self._mark_dead("the engine was shut down")
        self._outbox.put(Shutdown())
        self._watcher.join(SHUTDOWN_TIMEOUT_S)  # the watcher alone reaps the process (two joiners would race)
        if self._watcher.is_alive():
            logger.warning("the engine process did not stop within %.0f s; killing it", SHUTDOWN_TIMEOUT_S)
            self._process.kill()
            self._watcher.join()
        self._outbox.put(None)
        self._stop_reading()
        self._outputs.close()
        self._commands.close()

    # -- threads ----------------------------------------------------------------------------

    def _wait_until_ready(self, timeout_s: float | None) -> EngineReady:
        if not self._outputs.poll(timeout_s):
            self._process.kill()
            raise TimeoutError(f"the engine process did not load within {timeout_s} s")
        try:
            message = self._outputs.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(f"the engine process died while loading (exit code {self._process.exitcode})") from None
        if isinstance(message, EngineFailed):
            self._process.join()
            raise message.error
        return message

    def _send_loop(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except (OSError, ValueError):  # the engine is gone; the watcher reports it
                return

    def _read_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make `loop` (the caller's) read the engine's pipe; a caller's next `asyncio.run` is a new loop."""
        if loop is self._reader_loop or self._pipe_closed:
            return
        previous = self._reader_loop
        if previous is not None and not previous.is_closed():
            if previous.is_running():
                raise RuntimeError("an EngineProcessClient serves one event loop at a time; this one is in use by another")
            previous.remove_reader(self._frames.fd)
        loop.add_reader(self._frames.fd, self._read_available)
        self._reader_loop = loop

    def _stop_reading(self) -> None:
        loop = self._reader_loop
        if loop is not None and not loop.is_closed() and not self._pipe_closed:
            loop.remove_reader(self._frames.fd)
        self._reader_loop = None

    def _read_available(self) -> bool:
        """On the reading loop, when the pipe is readable: dispatch the messages it completes; False at its end."""
        try:
            messages = self._frames.read_available()
        except (EOFError, OSError):  # the engine is gone; the watcher reports it once the process has exited
            self._stop_reading()
            self._pipe_closed = True
            return False
        for message in messages:
            self._dispatch(message)
        return True

    def _watch_process(self) -> None:
        multiprocessing.connection.wait([self._process.sentinel])
        self._process.join()
        if self._dead_reason is not None:
            return
        reason = f"the engine process exited unexpectedly (exit code {self._process.exitcode})"
        logger.error("%s; every request fails with 503 until the server is restarted", reason)
        loop = self._reader_loop
        if loop is not None and loop.is_running():
            try:  # end the streams on their loop, after the deltas still in the pipe
                loop.call_soon_threadsafe(self._read_then_mark_dead, reason)
                return
            except RuntimeError:  # the loop closed meanwhile
                pass
        self._mark_dead(reason)

    def _read_then_mark_dead(self, reason: str) -> None:
        # The process has exited: what it sent is all there, then end-of-file.
        while not self._pipe_closed and self._read_available():
            pass
        self._mark_dead(reason)

    def _dispatch(self, message: FromEngine) -> None:
        if isinstance(message, StepOutputs):
            self._stats = message.stats
            self._records.extend(message.records)
            for output in message.outputs:
                self._deliver(output.request_id, output)
        elif isinstance(message, RequestFailed):
            self._deliver(message.request_id, message.error)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is None:
            return
        if isinstance(item, RequestOutput):  # unpickled here, so ours to complete in place
            item.prompt_token_ids = stream.prompt_token_ids
            item.prompt = stream.prompt
        if stream.loop is self._reader_loop:  # delivering on the reading loop: no thread hop
            stream.queue.put_nowait(item)
        else:
            stream.put(item)

    def _mark_dead(self, reason: str) -> None:
        with self._lock:
            if self._dead_reason is not None:
                return
            self._dead_reason = reason
            streams = list(self._streams.values())
        for stream in streams:
            stream.put(EngineDeadError(reason))
