"""HTTP load generator for any OpenAI-compatible server (like vLLM's serving benchmark).

Streams `POST /v1/completions` with token-id prompts (or their text), `ignore_eos` and
`max_tokens` so every server does the same work, at the workload's arrival times (Poisson at a
request rate, or all at once) under an optional concurrency cap. Measures per request the time
to first token (TTFT), time per output token after the first (TPOT) and the gaps between
streamed chunks (ITL); then throughput, and goodput: requests per second that met the SLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ember.bench.results import RequestTiming, RunResult
from ember.bench.workloads import BenchRequest, Workload


@dataclass(frozen=True)
class SLO:
    """A request is 'good' when its TTFT and its TPOT are both within these bounds."""

    ttft_ms: float = 2000.0
    tpot_ms: float = 200.0

    def met_by(self, timing: RequestTiming) -> bool:
        ttft, tpot = timing.ttft_s, timing.tpot_s
        return ttft is not None and ttft * 1000 <= self.ttft_ms and (tpot is None or tpot * 1000 <= self.tpot_ms)


async def _one_request(client, url: str, model: str | None, request: BenchRequest, prompt, timing: RequestTiming) -> None:
    body = {
        "prompt": prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    timing.arrival = time.monotonic()
    chunks = 0
    usage_tokens = None
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:300]
            raise RuntimeError(f"server answered {response.status_code} to request {request.request_id}: {detail}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            data = json.loads(payload)
            if data.get("usage"):
                usage_tokens = data["usage"].get("completion_tokens")
            if any(choice.get("text") for choice in data.get("choices") or []):
                now = time.monotonic()
                timing.token_times.append(now)
                chunks += 1
                if timing.first_token is None:
                    timing.first_token = now
    timing.finished = time.monotonic()
    timing.output_tokens = usage_tokens if usage_tokens is not None else chunks


async def run_load(
    base_url: str,
    workload: Workload,
    model: str | None = None,
    concurrency: int | None = None,
    prompts: list | None = None,
    timeout_s: float = 600.0,
    label: str = "server",
) -> RunResult:
    """Send every request of `workload` at its `arrival_s`, at most `concurrency` in flight."""
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    prompts = prompts or [r.prompt_token_ids for r in workload.requests]
    limit = asyncio.Semaphore(concurrency or len(workload.requests))
    timings = [RequestTiming(r.request_id, r.role, r.prompt_len, 0, 0.0) for r in workload.requests]
    errors: list[str] = []
    limits = httpx.Limits(max_connections=max(1, concurrency or len(workload.requests)))
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        started = time.monotonic()

        async def send(index: int) -> None:
            request = workload.requests[index]
            delay = started + request.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            async with limit:
                try:
                    await _one_request(client, url, model, request, prompts[index], timings[index])
                except (httpx.HTTPError, RuntimeError, json.JSONDecodeError) as error:
                    errors.append(f"{request.request_id}: {error}")

        await asyncio.gather(*(send(i) for i in range(len(workload.requests))))
        wall_s = time.monotonic() - started
    done = [t for t in timings if t.finished is not None and t.request_id not in {e.split(":")[0] for e in errors}]
    extra = {"base_url": base_url, "concurrency": concurrency, "request_rate": workload.params.get("request_rate"), "errors": errors[:10], "num_errors": len(errors)}
    return RunResult(label, workload.name, wall_s, sum(t.output_tokens for t in done), done, extra)


def goodput(result: RunResult, slo: SLO) -> float:
    """Requests per second that met the SLO."""
    good = sum(1 for t in result.requests if slo.met_by(t))
    return good / result.wall_s if result.wall_s > 0 else 0.0


def serve_summary(result: RunResult, slo: SLO) -> dict:
    from ember.bench.stats import latency_summary

    tpots = [t.tpot_s for t in result.requests if t.tpot_s is not None]
    return {
        "completed": len(result.requests),
        "errors": result.extra.get("num_errors", 0),
        "wall_s": result.wall_s,
        "output_tok_s": result.output_tok_s,
        "request_per_s": len(result.requests) / result.wall_s if result.wall_s > 0 else 0.0,
        "ttft": latency_summary(result.ttfts()),
        "tpot": latency_summary(tpots),
        "itl": latency_summary(result.itls()),
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "goodput_req_s": goodput(result, slo),
    }


# -- a local ember server to measure -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ember_server(model: str, dtype: str = "float32", extra_args: tuple[str, ...] = (), startup_timeout_s: float = 600.0):
    """Start `ember serve` on a free loopback port; yields its base URL; stops it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "ember.cli.main", "serve", "--model", model, "--dtype", dtype,
               "--host", "127.0.0.1", "--port", str(port), *extra_args]
    with local_server("ember serve", command, port, dict(os.environ), startup_timeout_s) as base_url:
        yield base_url


@contextlib.contextmanager
def local_server(name: str, command: list[str], port: int, environment: dict[str, str], startup_timeout_s: float = 600.0):
    """Run `command`, a server that will listen on loopback `port`; yields its base URL once /health answers 200;
    stops it afterwards. `name` is what its errors call it; its output goes to a kept log file they name."""
    log = tempfile.NamedTemporaryFile(prefix="ember-bench-serve-", suffix=".log", delete=False)  # noqa: SIM115 - kept open for the server's life, closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_health(name, process, base_url, Path(log.name), startup_timeout_s)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_for_health(name: str, process: subprocess.Popen, base_url: str, log: Path, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}; see {log}:\n" + log.read_text(errors="replace")[-1500:])
        try:
            if httpx.get(base_url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer /health within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
