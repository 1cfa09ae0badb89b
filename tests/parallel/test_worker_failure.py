"""A tensor-parallel `ember serve`: a worker that dies or hangs mid-stream is an error within 30 s, never a hang,
and stopping the server leaves no worker behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.server.harness import (
    ServeProcess,
    assert_openai_error,
    child_pids,
    is_running,
    parse_sse,
)

STREAM_BODY = {"model": "stories", "prompt": "Once upon a time", "max_tokens": 400, "stream": True, "temperature": 0}
ERROR_DEADLINE_S = 30


def _tp_stories_server(stories_dir: Path, log_path: Path, *extra: str, split: str = "--tensor-parallel-size") -> ServeProcess:
    return ServeProcess(
        [
            "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
            "--served-model-name", "stories", "--num-kv-blocks", "64", "--block-size", "16",
            split, "2", *extra,
        ],
        log_path,
        startup_timeout_s=300,  # two interpreters import torch and load on a shared 2-core box
    )  # fmt: skip


def _worker_pid(server: ServeProcess) -> int:
    """The rank-1 worker: a child of the engine process, which is a child of the server."""
    workers = [pid for engine in child_pids(server.pid) for pid in child_pids(engine) if is_running(pid)]
    assert len(workers) == 1, f"expected one worker process, found {workers}"
    return workers[0]


def _stream_and_signal(server: ServeProcess, pid: int, how: signal.Signals) -> tuple[list, float]:
    """Stream a completion, send `how` to `pid` after a few events; the events and seconds from the signal to the end."""
    lines: list[str] = []
    signalled_at = None
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=STREAM_BODY, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if len(lines) == 4:
                os.kill(pid, how)
                signalled_at = time.monotonic()
    assert signalled_at is not None, "the stream ended before the worker could be signalled"
    return parse_sse("\n".join(lines)), time.monotonic() - signalled_at


def _wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_a_killed_worker_ends_the_stream_with_503_error_and_leaves_no_orphan(stories_dir: Path, tmp_path: Path):
    with _tp_stories_server(stories_dir, tmp_path / "serve.log") as server:
        worker = _worker_pid(server)
        engine = child_pids(server.pid)
        events, seconds = _stream_and_signal(server, worker, signal.SIGKILL)
        assert seconds < ERROR_DEADLINE_S
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "engine_unavailable"
        assert "worker rank 1" in events[-2]["error"]["message"]
        assert _wait_until(lambda: httpx.get(f"{server.base_url}/health", timeout=5).status_code == 503, 10)
        refused = httpx.post(f"{server.base_url}/v1/completions", json={**STREAM_BODY, "stream": False}, timeout=10)
        assert assert_openai_error(refused, 503)["code"] == "engine_unavailable"
    assert _wait_until(lambda: not any(is_running(pid) for pid in engine), 30), "the engine outlived its server"


@pytest.mark.slow
def test_a_killed_pipeline_stage_ends_the_stream_with_an_error(stories_dir: Path, tmp_path: Path):
    """Rank 1 holds the later layers: rank 0 waits on its activations, and the send/receive fails instead."""
    with _tp_stories_server(stories_dir, tmp_path / "serve.log", split="--pipeline-parallel-size") as server:
        events, seconds = _stream_and_signal(server, _worker_pid(server), signal.SIGKILL)
        assert seconds < ERROR_DEADLINE_S
        assert events[-2]["error"]["code"] == "engine_unavailable"
        assert "worker rank 1" in events[-2]["error"]["message"]


@pytest.mark.slow
def test_a_hung_worker_fails_the_stream_after_the_collective_timeout(stories_dir: Path, tmp_path: Path):
    with _tp_stories_server(stories_dir, tmp_path / "serve.log", "--collective-timeout", "5") as server:
        worker = _worker_pid(server)
        try:
            events, seconds = _stream_and_signal(server, worker, signal.SIGSTOP)
        finally:
            os.kill(worker, signal.SIGCONT)
        assert seconds < ERROR_DEADLINE_S
        assert events[-2]["error"]["code"] == "engine_unavailable"
    assert _wait_until(lambda: not is_running(worker), 30), "the hung worker outlived its server"


@pytest.mark.slow
def test_killing_the_server_leaves_no_worker_behind(stories_dir: Path, tmp_path: Path):
    with _tp_stories_server(stories_dir, tmp_path / "serve.log") as server:
        worker = _worker_pid(server)
        os.kill(server.pid, signal.SIGKILL)
        assert _wait_until(lambda: server.returncode is not None, 30)
    assert _wait_until(lambda: not is_running(worker), 30), "the worker outlived its engine"
