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
import signal
import time
from multiprocessing.connection import Connection

from ember.engine.client import EngineDeadError
from ember.engine.config import EngineConfig
from ember.engine.llm_engine import LLMEngine, StepRecord
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
# Stats and step records travel at most this often while requests run, and with every step that starts, finishes
# or preempts a request or leaves the engine idle (the server's waiting room reads running and free seats from
# them): building, pickling and unpickling them each step cost the served path about 60 us a token at batch 1,
# as much again as the delta itself.
STATS_INTERVAL_S = 0.05


def run_engine_process(config: EngineConfig, commands: Connection, outputs: Connection, show_progress: bool = True) -> None:
    """Entry point of the engine process: load, announce, then step until shut down or orphaned.

    `commands` comes from the client, `outputs` goes to it (one pipe each way)."""
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
        self.unsent_records: list[StepRecord] = []
        self.stats_sent_at_s = float("-inf")
        self.started_request_ids: set[str] = set()  # those whose deltas the client has had (cleared as they finish)

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
                self.engine.add_request(
                    command.request_id, command.prompt_token_ids, command.params, command.prompt, command.priority, command.cache_salt
                )
            except ValueError as error:
                self.outputs.send(RequestFailed(command.request_id, _picklable(error)))

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
        record = self.engine.latest_step_record()
        if record is not None and ran_model:
            self.unsent_records.append(record)
        now_s = time.monotonic()
        has_news = (self._changes_requests(outputs) or (ran_model and record.num_preempted > 0)
                    or not self.engine.has_unfinished_requests() or now_s - self.stats_sent_at_s >= STATS_INTERVAL_S)
        if not outputs and not (ran_model and has_news):
            return
        stats = None
        records: list[StepRecord] = []
        if has_news:
            stats, records, self.unsent_records, self.stats_sent_at_s = self.engine.stats(), self.unsent_records, [], now_s
        self.outputs.send(StepOutputs([_without_prompt(o) for o in outputs], stats, records))

    def _changes_requests(self, outputs: list[RequestOutput]) -> bool:
        """Whether these deltas start or finish a request (the running count the client reads changes)."""
        changes = False
        for output in outputs:
            if output.finished:
                self.started_request_ids.discard(output.request_id)
                changes = True
            elif output.request_id not in self.started_request_ids:
                self.started_request_ids.add(output.request_id)
                changes = True
        return changes

    def _fail_all(self, failure: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            self.outputs.send(RequestFailed(request_id, failure))
        self.engine.step()  # drain the abort outputs so nothing lingers
        self.started_request_ids.clear()


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
