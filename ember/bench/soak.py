"""`ember bench soak`: many mixed requests against a real server, checking that nothing is lost.

The request mix covers what a server must survive at once: chat and text completions, token-id
and batched prompts, streamed or whole, `n` > 1, stop strings, seeds, logprobs, and clients that
hang up mid-answer. Run against a KV pool small enough to force preemption, it checks:

- every request not cancelled by the client ends complete (each choice has a finish reason,
  every stream ends with `[DONE]`): `lost` counts those that did not;
- no request gets a 5xx or an error event, and no valid request gets a 4xx;
- greedy (temperature 0) answers to one probe prompt are identical whatever ran beside them;
- afterwards no request runs or waits and every KV block is free; the server's resident memory
  (`process_resident_memory_bytes` of /metrics) is sampled throughout.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx

PROBE_PROMPT = "The quick brown fox"
PROBE_EVERY = 25
STOP_STRINGS = (["e"], ["\n", "."], [" the", "ing"])
WORDS = ["time", "river", "light", "stone", "garden", "letter", "window", "morning", "silver", "winter", "ocean", "story"]


@dataclass(frozen=True)
class SoakSettings:
    """How big the soak is. `cancel_fraction` of requests are abandoned by their client mid-answer."""

    num_requests: int = 10_000
    concurrency: int = 32
    cancel_fraction: float = 0.1
    max_tokens: int = 24
    seed: int = 0
    served_model: str | None = None
    sample_every_s: float = 1.0
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"the soak needs at least 1 request, got {self.num_requests}")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {self.concurrency}")
        if not 0.0 <= self.cancel_fraction < 1.0:
            raise ValueError(f"--cancel-fraction must be in [0, 1), got {self.cancel_fraction}")
        if self.max_tokens < 2:
            raise ValueError(f"--max-tokens must be at least 2, got {self.max_tokens}")


@dataclass
class SoakRequest:
    """One request of the soak and, when its client will hang up, after how many events."""

    index: int
    path: str
    body: dict
    expected_choices: int
    cancel_after_events: int | None = None
    is_probe: bool = False


@dataclass
class SoakOutcome:
    """What happened to one request."""

    kind: str  # completed, cancelled, client_error, server_error, lost
    detail: str = ""
    probe_text: str | None = None


def soak_requests(settings: SoakSettings) -> list[SoakRequest]:
    """The soak's requests, the same for the same settings."""
    rng = random.Random(settings.seed)
    return [_one_request(rng, index, settings) for index in range(settings.num_requests)]


def _one_request(rng: random.Random, index: int, settings: SoakSettings) -> SoakRequest:
    if index % PROBE_EVERY == 0:
        body = {"prompt": PROBE_PROMPT, "max_tokens": settings.max_tokens, "temperature": 0, "ignore_eos": True}
        return SoakRequest(index, "/v1/completions", _with_model(body, settings), 1, is_probe=True)
    n = rng.choice((1, 1, 1, 2, 3))
    body: dict = {"max_tokens": rng.randint(2, settings.max_tokens), "n": n, "stream": rng.random() < 0.6}
    if rng.random() < 0.5:
        body["temperature"] = rng.choice((0.0, 0.7, 1.0))
    if rng.random() < 0.5:
        body["seed"] = rng.randrange(2**31)
    if rng.random() < 0.4:
        body["stop"] = rng.choice(STOP_STRINGS)
    if rng.random() < 0.2:
        body["ignore_eos"] = True
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    path, num_prompts = _prompt_fields(rng, body)
    cancel = None
    if rng.random() < settings.cancel_fraction:
        cancel = rng.randint(0, 3)
    return SoakRequest(index, path, _with_model(body, settings), n * num_prompts, cancel)


def _prompt_fields(rng: random.Random, body: dict) -> tuple[str, int]:
    """Fill in a chat or completion prompt; the path and the number of prompts."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
    kind = rng.choice(("chat", "chat", "text", "texts", "ids"))
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        if rng.random() < 0.3:
            body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 3)
        return "/v1/chat/completions", 1
    if rng.random() < 0.3:
        body["logprobs"] = rng.randint(0, 3)
    if kind == "texts":
        body["prompt"] = [text, text[::-1].strip() or "x"]
        return "/v1/completions", 2
    body["prompt"] = [rng.randrange(100, 20_000) for _ in range(rng.randint(1, 40))] if kind == "ids" else text
    return "/v1/completions", 1


def _with_model(body: dict, settings: SoakSettings) -> dict:
    return {**body, "model": settings.served_model} if settings.served_model else body


# -- sending ----------------------------------------------------------------------------------


async def send(client: httpx.AsyncClient, request: SoakRequest) -> SoakOutcome:
    """Send one request and judge what came back."""
    try:
        if request.body.get("stream"):
            return await _send_streamed(client, request)
        if request.cancel_after_events is not None:
            return await _send_abandoned(client, request)
        response = await client.post(request.path, json=request.body)
    except httpx.HTTPError as error:
        return SoakOutcome("lost", f"{type(error).__name__}: {error}")
    if response.status_code != 200:
        return _refused(response.status_code, response.text)
    return _judge_whole(request, response.json())


async def _send_abandoned(client: httpx.AsyncClient, request: SoakRequest) -> SoakOutcome:
    """A whole-answer request whose client hangs up after a moment."""
    task = asyncio.ensure_future(client.post(request.path, json=request.body))
    await asyncio.wait({task}, timeout=0.05 * (1 + request.cancel_after_events))
    if not task.done():
        task.cancel()
        return SoakOutcome("cancelled")
    response = task.result()
    if response.status_code != 200:
        return _refused(response.status_code, response.text)
    return _judge_whole(request, response.json())


async def _send_streamed(client: httpx.AsyncClient, request: SoakRequest) -> SoakOutcome:
    events: list = []
    async with client.stream("POST", request.path, json=request.body) as response:
        if response.status_code != 200:
            return _refused(response.status_code, (await response.aread()).decode(errors="replace"))
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
            if request.cancel_after_events is not None and len(events) > request.cancel_after_events:
                return SoakOutcome("cancelled")  # leaving the block closes the connection mid-stream
    return _judge_stream(request, events)


def _refused(status_code: int, text: str) -> SoakOutcome:
    kind = "server_error" if status_code >= 500 else "client_error"
    return SoakOutcome(kind, f"{status_code}: {text[:200]}")


def _judge_whole(request: SoakRequest, body: dict) -> SoakOutcome:
    choices = body.get("choices") or []
    reasons = {choice.get("index"): choice.get("finish_reason") for choice in choices}
    if len(choices) != request.expected_choices or None in reasons.values():
        return SoakOutcome("lost", f"choices {reasons} (expected {request.expected_choices})")
    text = choices[0].get("text") if request.is_probe else None
    return SoakOutcome("completed", probe_text=text)


def _judge_stream(request: SoakRequest, events: list) -> SoakOutcome:
    if not events or events[-1] != "[DONE]":
        return SoakOutcome("lost", f"stream ended without [DONE] after {len(events)} events")
    errors = [event["error"] for event in events[:-1] if "error" in event]
    if errors:
        return SoakOutcome("server_error", f"error event: {errors[0]}")
    finished = {
        choice["index"] for event in events[:-1] for choice in event.get("choices") or [] if choice.get("finish_reason")
    }
    if len(finished) != request.expected_choices:
        return SoakOutcome("lost", f"{len(finished)} of {request.expected_choices} choices finished")
    return SoakOutcome("completed")


# -- the server's side --------------------------------------------------------------------------


def read_metrics(base_url: str) -> dict[str, float]:
    """The server's /metrics as {name: value}, summed over labels (e.g. finish reasons)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    values: dict[str, float] = {}
    for match in re.finditer(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE):
        values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(2))
    return values


def wait_until_idle(base_url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """/metrics once nothing runs or waits and no KV block is used (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = read_metrics(base_url)
        is_idle = (
            metrics.get("ember:num_requests_running") == 0
            and metrics.get("ember:num_requests_waiting") == 0
            and metrics.get("ember:kv_cache_free_blocks") == metrics.get("ember:kv_cache_total_blocks")
        )
        if is_idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


@dataclass
class SoakResult:
    """The soak's counts, the server's state afterwards, and samples of it over time."""

    settings: dict
    num_requests: int
    completed: int
    cancelled: int
    client_errors: int
    server_errors: int
    lost: int
    error_samples: list[str]
    greedy_variants: int
    preemptions: int
    blocks_free_after: int
    blocks_total: int
    requests_running_after: int
    rss_before_bytes: int
    rss_after_bytes: int
    rss_peak_bytes: int
    wall_s: float
    samples: list[dict] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "requests_per_s": self.requests_per_s}


async def _sample(base_url: str, every_s: float, samples: list[dict], started: float) -> None:
    while True:
        metrics = await asyncio.to_thread(read_metrics, base_url)
        samples.append(
            {
                "t_s": round(time.monotonic() - started, 2),
                "rss_bytes": metrics.get("process_resident_memory_bytes", 0.0),
                "running": metrics.get("ember:num_requests_running", 0.0),
                "waiting": metrics.get("ember:num_requests_waiting", 0.0),
                "kv_cache_usage": metrics.get("ember:kv_cache_usage_perc", 0.0),
                "preemptions": metrics.get("ember:num_preemptions_total", 0.0),
            }
        )
        await asyncio.sleep(every_s)


async def run_soak(base_url: str, settings: SoakSettings, on_done: Callable[[], None] = lambda: None) -> SoakResult:
    """Send the soak's requests (at most `concurrency` in flight), then read the server's state."""
    requests = soak_requests(settings)
    before = await asyncio.to_thread(wait_until_idle, base_url)
    limit = asyncio.Semaphore(settings.concurrency)
    samples: list[dict] = []
    started = time.monotonic()
    sampler = asyncio.ensure_future(_sample(base_url, settings.sample_every_s, samples, started))
    limits = httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=settings.request_timeout_s, limits=limits) as client:

        async def one(request: SoakRequest) -> SoakOutcome:
            async with limit:
                outcome = await send(client, request)
            on_done()
            return outcome

        outcomes = await asyncio.gather(*(one(request) for request in requests))
    wall_s = time.monotonic() - started
    sampler.cancel()
    after = await asyncio.to_thread(wait_until_idle, base_url)
    return _result(settings, outcomes, before, after, samples, wall_s)


def _result(settings, outcomes, before, after, samples, wall_s) -> SoakResult:
    kinds = Counter(outcome.kind for outcome in outcomes)
    probes = {outcome.probe_text for outcome in outcomes if outcome.probe_text is not None}
    rss_samples = [sample["rss_bytes"] for sample in samples] or [0.0]
    return SoakResult(
        settings=asdict(settings),
        num_requests=len(outcomes),
        completed=kinds["completed"],
        cancelled=kinds["cancelled"],
        client_errors=kinds["client_error"],
        server_errors=kinds["server_error"],
        lost=kinds["lost"],
        error_samples=[f"{o.kind}: {o.detail}" for o in outcomes if o.kind not in ("completed", "cancelled")][:10],
        greedy_variants=len(probes),
        preemptions=int(after.get("ember:num_preemptions_total", 0) - before.get("ember:num_preemptions_total", 0)),
        blocks_free_after=int(after.get("ember:kv_cache_free_blocks", 0)),
        blocks_total=int(after.get("ember:kv_cache_total_blocks", 0)),
        requests_running_after=int(after.get("ember:num_requests_running", 0) + after.get("ember:num_requests_waiting", 0)),
        rss_before_bytes=int(before.get("process_resident_memory_bytes", 0)),
        rss_after_bytes=int(after.get("process_resident_memory_bytes", 0)),
        rss_peak_bytes=int(max(rss_samples)),
        wall_s=wall_s,
        samples=samples,
    )


# -- reporting ----------------------------------------------------------------------------------


def summary_rows(result: dict) -> list[tuple[str, str]]:
    """(measure, value) rows of a soak result, for the terminal table and the report."""
    mib = 2**20
    return [
        ("requests", f"{result['num_requests']} ({result['requests_per_s']:.1f}/s over {result['wall_s']:.0f} s)"),
        ("completed", str(result["completed"])),
        ("cancelled by the client", str(result["cancelled"])),
        ("lost", str(result["lost"])),
        ("5xx or error events", str(result["server_errors"])),
        ("4xx", str(result["client_errors"])),
        ("greedy probe variants (1 = identical)", str(result["greedy_variants"])),
        ("preemptions", str(result["preemptions"])),
        ("KV blocks free after", f"{result['blocks_free_after']} / {result['blocks_total']}"),
        (
            "server RSS before / peak / after (MiB)",
            f"{result['rss_before_bytes'] / mib:.0f} / {result['rss_peak_bytes'] / mib:.0f} / {result['rss_after_bytes'] / mib:.0f}",
        ),
    ]


def plot_soak(result: dict, path) -> None:
    """Server RSS and requests in flight over the soak, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    times = [sample["t_s"] for sample in samples]
    figure, (memory, load) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    memory.plot(times, [sample["rss_bytes"] / 2**20 for sample in samples], color="tab:red")
    memory.set_ylabel("server RSS (MiB)")
    memory.set_ylim(bottom=0)
    load.plot(times, [sample["running"] for sample in samples], label="running")
    load.plot(times, [sample["waiting"] for sample in samples], label="waiting")
    load.set_ylabel("requests")
    load.set_xlabel("seconds")
    load.legend()
    figure.suptitle(f"soak: {result['num_requests']} requests, {result['lost']} lost, {result['server_errors']} 5xx")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
