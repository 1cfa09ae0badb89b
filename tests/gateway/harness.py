"""Helpers for gateway tests: apps on loopback threads, gateway subprocesses, a real Redis."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn
import yaml

from tests.server.harness import REPO_ROOT, free_port


class ThreadedApp:
    """An ASGI app under uvicorn on a free loopback port in a daemon thread; on exit, requests
    still running (a stalled backend) are cancelled after one second."""

    def __init__(self, app) -> None:
        self.app = app
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ThreadedApp:
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


def write_config(folder: Path, config: dict) -> Path:
    path = folder / f"gateway-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class GatewayProcess:
    """A real `ember gateway` subprocess on a free port; its log is quoted if it fails to start."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._command = [sys.executable, "-m", "ember.cli.main", "gateway", "--config", str(config_path), "--port", str(self.port)]
        self._log_path = log_path
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> GatewayProcess:
        log = self._log_path.open("wb")
        self._process = subprocess.Popen(self._command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ember gateway exited with {self._process.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"ember gateway was not healthy within 60 s:\n{self.log_text()}")

    def __exit__(self, *_: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def log_text(self) -> str:
        return self._log_path.read_text(errors="replace")


class RedisServer:
    """A real redis-server on a free port with its files in `folder`, no persistence.

    Debian's redis-server is installed by `make install-test` (and .ci/run); a machine
    without it fails these tests with that instruction rather than skipping them.
    """

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._folder = folder
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make install-test` (it runs apt-get install redis-server)")
        self._process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self._folder), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer within 10 s") from None
                time.sleep(0.05)

    def __exit__(self, *_: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


TINY_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


class EmberReplica:
    """A real `ember serve` process on a fixed port that a test can kill (SIGKILL, like a
    crash) and start again on the same port; output goes to `log_path`."""

    def __init__(self, serve_args: list[str], log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._command = [sys.executable, "-m", "ember.cli.main", "serve", *serve_args, "--host", "127.0.0.1", "--port", str(self.port)]
        self._log_path = log_path
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        log = self._log_path.open("ab")
        self._process = subprocess.Popen(self._command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_healthy(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ember serve exited with {self._process.returncode}:\n{self._log_path.read_text(errors='replace')}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"ember serve was not healthy within {timeout_s} s:\n{self._log_path.read_text(errors='replace')}")

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)

    def metric(self, name: str) -> float:
        """The value of one unlabelled-or-single-series metric from the replica's /metrics."""
        for line in httpx.get(f"{self.base_url}/metrics", timeout=5).text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def __enter__(self) -> EmberReplica:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def stories_serve_args(stories_dir: Path, template_path: Path) -> list[str]:
    """`ember serve` flags for the 260K-parameter llama2.c stories model with a plain chat template."""
    template_path.write_text(TINY_CHAT_TEMPLATE)
    return [
        "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
        "--served-model-name", "tiny", "--chat-template", str(template_path),
    ]  # fmt: skip
