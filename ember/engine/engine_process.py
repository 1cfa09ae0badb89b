"""The engine process: an LLMEngine whose step loop runs on this process's main thread.

Why a process: measured on CPU, the same step loop on a secondary thread decodes at about half
the speed (the OpenMP runtime behind torch and ember's kernels), and an HTTP event loop sharing
the GIL with the step loop adds latency under load. The process reads commands between steps
and sends each step's deltas to its client (ember.engine.process_client) over a pipe of their own.
It exits when told to, or when its client goes away (the pipe closes): never an orphan.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
from multiprocessing.connection import Connection

from ember.engine.client import EngineDeadError
from ember.engine.config import EngineConfig
from ember.engine.llm_engine import LLMEngine
from ember.engine.messages import (
    AbortRequest,
    AddRequest,
    EngineFailed,
    EngineReady,
    RequestFailed,
    Shutdown,
    StepOutputs,
    ToEngine,
)
from ember.engine.outputs import RequestOutput
from ember.parallel.driver import WorkerFailedError

logger = logging.getLogger(__name__)

WORKER_CHECK_INTERVAL_S = 1.0


def run_engine_process(config: EngineConfig, commands: Connection, outputs: Connection, show_progress: bool = True,
                       cpu_cores: frozenset[int] | None = None) -> None:
    """Entry point of the engine process: load, announce, then step until shut down or orphaned.

    `commands` comes from the client, `outputs` goes to it (one pipe each way). `cpu_cores`: the cores this
    process keeps to, set before any thread is started, so the step's threads and the worker ranks inherit them."""
    if cpu_cores is not None:
        _keep_to(cpu_cores)
    # Ctrl-C or a SIGTERM to the whole process group would kill the engine in the middle of the
    # server's drain: the client ends this process (Shutdown, or its pipe closing), not a signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = LLMEngine(config, show_progress=show_progress)
    except Exception as error:  # a bad model path or config: the client re-raises it
        outputs.send(EngineFailed(_picklable(error)))
        outputs.close()
        return
    # The engine lives as long as this process: what it loaded (modules, tokenizer tables) leaves the collector's
    # generations, so a step's garbage collections stop walking it (measured 2-3% of a SmolLM2 bfloat16 mixed run's
    # wall time). Only here: frozen objects are never collected, which an in-process engine that is dropped would leak.
    gc.freeze()
    outputs.send(
        EngineReady(engine.model_name, engine.max_model_len, engine.tokenizer_source, engine.limits, engine.stats())
    )
    try:
        _EngineLoop(engine, commands, outputs).run()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        logger.info("the engine's client went away; the engine process exits")
    except WorkerFailedError as error:
        logger.error("%s; the engine process exits (its client answers 503)", error)
        raise SystemExit(1) from error
    finally:
        engine.shutdown()
        commands.close()
        outputs.close()


class _EngineLoop:
    """Commands in between steps, deltas out after each step."""

    def __init__(self, engine: LLMEngine, commands: Connection, outputs: Connection) -> None:
        self.engine = engine
        self.commands = commands
        self.outputs = outputs
        self.is_stopping = False
        # Idle, a tensor-parallel engine still wakes to check its workers (a death shows in /health).
        self.idle_wait_s = WORKER_CHECK_INTERVAL_S if engine.workers is not None else None

    def run(self) -> None:
        while not self.is_stopping:
            # Idle: sleep in the kernel until a command comes; busy: only take what is there.
            wait_s = 0.0 if self.engine.has_unfinished_requests() else self.idle_wait_s
            while self.commands.poll(wait_s):
                self._apply(self.commands.recv())
                wait_s = 0.0
            if self.is_stopping:
                return
            self.engine.check_health()
            self._step()

    def _apply(self, command: ToEngine) -> None:
        if isinstance(command, Shutdown):
            self.is_stopping = True
        elif isinstance(command, AbortRequest):
            self.engine.abort_request(command.request_id)
        elif isinstance(command, AddRequest):
            try:
                self.engine.add_checked_request(command.request)
            except ValueError as error:
                self.outputs.send(RequestFailed(command.request.request_id, _picklable(error)))

    def _step(self) -> None:
        steps_before = self.engine.num_steps
        try:
            outputs = self.engine.step()
        except WorkerFailedError as error:  # the ranks cannot step again: fail the requests as 503s, then exit
            self._fail_all(EngineDeadError(str(error)))
            raise
        except Exception as error:  # a failed step fails its requests, never the process
            logger.exception("engine step failed")
            self._fail_all(RuntimeError(f"the engine failed while running this request: {error}"))
            return
        ran_model = self.engine.num_steps != steps_before
        if not outputs and not ran_model:
            return
        record = self.engine.latest_step_record()
        records = [record] if record is not None and ran_model else []
        self.outputs.send(StepOutputs([_without_prompt(o) for o in outputs], self.engine.stats(), records))

    def _fail_all(self, failure: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            self.outputs.send(RequestFailed(request_id, failure))
        self.engine.step()  # drain the abort outputs so nothing lingers


def _keep_to(cpu_cores: frozenset[int]) -> None:
    """Keep every thread of this process to `cpu_cores` (a thread started while the interpreter imported, before
    this runs, would keep the old cores); threads started later inherit them."""
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), cpu_cores)


def _without_prompt(output: RequestOutput) -> RequestOutput:
    """The delta as sent: the client already holds the prompt, so it does not travel every step."""
    return dataclasses.replace(output, prompt_token_ids=[], prompt=None)


def _picklable(error: BaseException) -> BaseException:
    """`error` itself if it survives pickling, else a RuntimeError with its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
