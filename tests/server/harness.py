"""Helpers for server tests: free ports, a server in a thread or a subprocess, error-body checks."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from ember.server.serve import uvicorn_config

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED_MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    """A loopback port nobody listens on right now (bind to port 0, read it back, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HealthProbe:
    """Asks a server's /health every 10 ms from a thread while the `with` block runs; `latencies_s` are the answers'
    round trips (each one asserted 200)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.latencies_s: list[float] = []
        self._is_done = threading.Event()
        self._thread = threading.Thread(target=self._probe)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        while not self.latencies_s and self._thread.is_alive():  # under way before the block's load starts
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self._is_done.set()
        self._thread.join(timeout=30)

    def _probe(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as prober:
            while not self._is_done.is_set():
                started = time.perf_counter()
                assert prober.get("/health").status_code == 200
                self.latencies_s.append(time.perf_counter() - started)
                time.sleep(0.01)


class ThreadedServer:
    """Runs an app of `build_app` on a free loopback port, in a daemon thread, with the uvicorn
    settings `ember serve` uses (header deadline included)."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        server_config = dataclasses.replace(app.state.context.config, host="127.0.0.1", port=self.port)
        self._server = uvicorn.Server(uvicorn_config(app, server_config, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the threaded test server did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class ServeProcess:
    """A real `ember serve` subprocess (`python -m ember.cli.main serve ...`) on a free loopback port.

    Its output goes to a log file, which is quoted when it fails to become healthy.
    """

    def __init__(self, args: list[str], log_path: Path, startup_timeout_s: float = 180.0) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._command = [
            sys.executable, "-m", "ember.cli.main", "serve", *args,
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        self._log_path = log_path
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen | None = None
        self._log_file = None

    def __enter__(self) -> ServeProcess:
        self._log_file = self._log_path.open("wb")
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._process = subprocess.Popen(
            self._command, cwd=REPO_ROOT, stdout=self._log_file, stderr=subprocess.STDOUT, env=environment
        )
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ember serve exited with {self._process.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"ember serve was not healthy within {self._startup_timeout_s} s:\n{self.log_text()}")

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the server process."""
        assert self._process is not None, "the server is not started"
        self._process.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        """Wait for the process to end; its exit status."""
        assert self._process is not None, "the server is not started"
        return self._process.wait(timeout=timeout_s)

    def __exit__(self, *_: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @property
    def pid(self) -> int:
        """The server's process id (its engine runs in a child process)."""
        assert self._process is not None, "the server has not been started"
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended."""
        return None if self._process is None else self._process.poll()

    def log_text(self) -> str:
        """What the server printed so far."""
        return self._log_path.read_text(errors="replace")


def child_pids(pid: int) -> list[int]:
    """Process ids whose parent is `pid` (read from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def is_running(pid: int) -> bool:
    """Whether a process `pid` exists and is not a zombie."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def smollm2_server_process(gguf: Path, log_path: Path, *extra_args: str) -> ServeProcess:
    """A `serve` process (not yet started) for the SmolLM2 GGUF, served as `smollm2-135m-instruct`.

    With exact (float32) activations in its 4-bit layers: tests hold its greedy answers ("Paris"), one of
    which sits on a 0.08-nat near-tie that int8 activation rounding flips (tests/quant bound that path)."""
    return ServeProcess(["--model", str(gguf), "--served-model-name", SERVED_MODEL, "--quant-activations", "float32", *extra_args], log_path)


def tiny_server_process(model_dir: Path, tokenizer_dir: Path, log_path: Path, *extra_args: str) -> ServeProcess:
    """A `serve` process (not yet started) for a tiny random model with the SmolLM2 tokenizer."""
    return ServeProcess(["--model", str(model_dir), "--tokenizer", str(tokenizer_dir), *extra_args], log_path)


def process_rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def assert_openai_error(response: httpx.Response, status_code: int) -> dict:
    """Assert `response` is `status_code` with an OpenAI error body and no traceback; return the error."""
    assert response.status_code == status_code, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["code"], str) and error["code"], error
    assert "Traceback" not in response.text
    return error


def parse_sse(text: str) -> list[dict | str]:
    """The `data:` payloads of an SSE body, JSON-decoded except the final `[DONE]`."""
    import json

    payloads: list[dict | str] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads
