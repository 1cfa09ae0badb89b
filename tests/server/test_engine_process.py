"""`ember serve` runs its engine in a child process: its death is a 503, never a hang or an orphan."""

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

STREAM_BODY = {"model": "stories", "prompt": "Once upon a time", "max_tokens": 200, "stream": True, "temperature": 0}


def _stories_server(stories_dir: Path, log_path: Path) -> ServeProcess:
    return ServeProcess(
        [
            "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
            "--served-model-name", "stories", "--num-kv-blocks", "64", "--block-size", "16",
        ],
        log_path,
    )  # fmt: skip


def _engine_pid(server: ServeProcess) -> int:
    children = [pid for pid in child_pids(server.pid) if is_running(pid)]
    assert len(children) >= 1, "the server has no engine child process"
    return max(children)  # spawn's resource tracker (if any) starts before the engine


def _wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_a_killed_engine_ends_streams_with_an_error_and_answers_503(stories_dir: Path, tmp_path: Path):
    with _stories_server(stories_dir, tmp_path / "serve.log") as server:
        engine_pid = _engine_pid(server)
        started = time.monotonic()
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=STREAM_BODY, timeout=30) as response:
            assert response.status_code == 200
            lines = []
            for line in response.iter_lines():
                lines.append(line)
                if len(lines) == 2:
                    # A group-wide SIGTERM must not kill the engine under the server's drain.
                    os.kill(engine_pid, signal.SIGTERM)
                if len(lines) == 4:
                    assert is_running(engine_pid)
                    os.kill(engine_pid, signal.SIGKILL)
        events = parse_sse("\n".join(lines))
        assert time.monotonic() - started < 30
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "engine_unavailable"

        health = httpx.get(f"{server.base_url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "engine_dead"
        refused = httpx.post(f"{server.base_url}/v1/completions", json={**STREAM_BODY, "stream": False}, timeout=10)
        error = assert_openai_error(refused, 503)
        assert error["code"] == "engine_unavailable" and refused.headers["retry-after"]
        assert "engine process exited unexpectedly" in server.log_text()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_server_leaves_no_engine_process_behind(stories_dir: Path, tmp_path: Path, how: signal.Signals):
    with _stories_server(stories_dir, tmp_path / "serve.log") as server:
        engine_pid = _engine_pid(server)
        os.kill(server.pid, how)
        assert _wait_until(lambda: server.returncode is not None, 30)
    assert _wait_until(lambda: not is_running(engine_pid), 30), "the engine process outlived its server"
