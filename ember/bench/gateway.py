"""`ember bench gateway`: prefix-aware routing vs round-robin across 2 real ember replicas, and
the latency the gateway adds.

Workload (shared prefixes): `--documents` distinct documents of about `--doc-chars` characters
cut from the corpus, each asked `--questions` different short questions; the requests are
shuffled (same order for every policy) and streamed through a gateway subprocess at
`--concurrency`. For each policy the replicas start fresh (empty prefix caches); the prefix-cache
hit rate is read from the replicas' own counters (`ember:prefix_cache_hits / queries`) and the
TTFT is measured by the client.

Overhead: the same tiny non-streamed request sent alternately straight to a replica and through
the gateway, `--overhead-pairs` times; the added latency is gateway minus direct, p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ember.bench.serve import ember_server, free_port
from ember.bench.stats import mean, percentile
from ember.bench.workloads import corpus_text

POLICIES = ("round_robin", "prefix_aware")
SERVED_NAME = "bench"


def build_requests(documents: int, doc_chars: int, questions: int, seed: int) -> list[str]:
    """Prompts: document + question, `questions` per document, shuffled by `seed`."""
    text, _ = corpus_text(max_chars=documents * doc_chars * 2 + 10_000)
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(0, len(text) - doc_chars), documents))
    prompts = [
        f"Document:\n{text[start:start + doc_chars]}\n\nQuestion {number}: what does the document say about item {rng.randint(1, 999)}?\nAnswer:"
        for start in starts
        for number in range(questions)
    ]
    rng.shuffle(prompts)
    return prompts


@contextlib.contextmanager
def gateway_process(replica_urls: list[str], routing: str, folder: Path):
    """An `ember gateway` subprocess over the replicas with `routing`; yields its base URL."""
    import httpx
    import yaml

    config = {
        "backends": [
            {"name": f"r{index}", "url": url + "/v1", "continuous_usage": True, "first_token_timeout_s": 600, "timeout_s": 600}
            for index, url in enumerate(replica_urls)
        ],
        "models": [{"name": SERVED_NAME, "backends": [f"r{index}" for index in range(len(replica_urls))], "routing": routing}],
        "store": {"path": str(folder / f"{routing}.sqlite3")},
    }
    config_path = folder / f"{routing}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    with (folder / f"{routing}.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ember.gateway", "--config", str(config_path), "--port", str(port), "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
        )  # fmt: skip
        base_url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ember gateway did not start; see {folder / (routing + '.log')}")
                try:
                    if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            yield base_url
        finally:
            process.terminate()
            process.wait(timeout=30)


def warm(replica_urls: list[str]) -> None:
    """One short request straight to each replica, so first-use costs stay out of the timings."""
    import httpx

    for url in replica_urls:
        body = {"model": SERVED_NAME, "prompt": "Warm up.", "max_tokens": 2, "temperature": 0}
        httpx.post(url + "/v1/completions", json=body, timeout=600).raise_for_status()


def prefix_counters(replica_urls: list[str]) -> tuple[float, float]:
    """(prefix-cache hit tokens, looked-up tokens) summed over the replicas."""
    import httpx

    hits = queries = 0.0
    for url in replica_urls:
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("ember:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("ember:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def stream_ttfts(base_url: str, prompts: list[str], concurrency: int, max_tokens: int, progress) -> list[float]:
    """Client-side time to first token of each prompt, streamed at `concurrency`."""
    import httpx

    ttfts: list[float] = []
    queue = list(prompts)

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            prompt = queue.pop(0)
            body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
            started = time.monotonic()
            first = None
            async with client.stream("POST", base_url + "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"gateway answered {response.status_code}: {(await response.aread())[:300]!r}")
                async for line in response.aiter_lines():
                    if first is None and line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                        first = time.monotonic() - started  # the first token's chunk
            ttfts.append(first if first is not None else time.monotonic() - started)
            progress()

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return ttfts


def measure_overhead(replica_url: str, gateway_url: str, pairs: int, progress) -> dict:
    """p50/p99 latency of a 1-token request direct and through the gateway, and their difference."""
    import httpx

    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    direct, through = [], []
    with httpx.Client(timeout=60) as client:
        for index in range(pairs + 2):
            for url, sink in ((replica_url, direct), (gateway_url, through)):
                started = time.perf_counter()
                client.post(url + "/v1/completions", json=body).raise_for_status()
                if index >= 2:  # the first two pairs warm connections
                    sink.append((time.perf_counter() - started) * 1000)
            progress()
    added = [gateway - straight for gateway, straight in zip(through, direct, strict=True)]
    summary = lambda values: {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99), "mean_ms": mean(values)}  # noqa: E731
    return {"pairs": pairs, "direct": summary(direct), "gateway": summary(through), "added": summary(added)}


@dataclasses.dataclass(frozen=True)
class GatewayBenchSettings:
    """The workload and measurement sizes of `ember bench gateway`."""

    model: str = "smollm2-135m-instruct"
    documents: int = 8
    doc_chars: int = 2400
    questions: int = 4
    concurrency: int = 4
    max_tokens: int = 8
    overhead_pairs: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, int) and field.name != "seed" and value < 1:
                raise ValueError(f"--{field.name.replace('_', '-')} must be at least 1, got {value}")


def run_gateway_bench(settings: GatewayBenchSettings, tick, advance=lambda: None, plot: Path | None = None) -> dict:
    """Both policies on fresh replicas, then the overhead; returns the results dictionary.

    `tick(description)` is called at each phase, `advance()` after each request or pair."""
    prompts = build_requests(settings.documents, settings.doc_chars, settings.questions, settings.seed)
    results: dict = {"workload": {**dataclasses.asdict(settings), "requests": len(prompts)}, "semantic_cache": semantic_cache_quality()}
    serve_args = ("--served-model-name", SERVED_NAME)
    with tempfile.TemporaryDirectory(prefix="ember-bench-gateway-") as folder:
        for routing in POLICIES:
            tick(f"gateway bench, {routing}: starting 2 replicas and a gateway")
            with ember_server(settings.model, extra_args=serve_args) as r0, ember_server(settings.model, extra_args=serve_args) as r1, \
                    gateway_process([r0, r1], routing, Path(folder)) as gateway:  # fmt: skip
                warm([r0, r1])
                tick(f"gateway bench, {routing}: {len(prompts)} requests")
                hits_before, queries_before = prefix_counters([r0, r1])
                ttfts = asyncio.run(stream_ttfts(gateway, prompts, settings.concurrency, settings.max_tokens, advance))
                hits_after, queries_after = prefix_counters([r0, r1])
                results[routing] = {
                    "prefix_cache_hit_rate": (hits_after - hits_before) / max(1.0, queries_after - queries_before),
                    "mean_ttft_ms": mean(ttfts) * 1000,
                    "p50_ttft_ms": percentile(ttfts, 50) * 1000,
                    "p99_ttft_ms": percentile(ttfts, 99) * 1000,
                }
                print(f"[bench gateway] {routing}: {json.dumps(results[routing])}", file=sys.stderr, flush=True)
                if routing == POLICIES[-1]:
                    tick("gateway bench: overhead")
                    results["overhead"] = measure_overhead(r0, gateway, settings.overhead_pairs, advance)
    rr, pa = results["round_robin"], results["prefix_aware"]
    results["ratios"] = {"hit_rate_prefix_over_rr": pa["prefix_cache_hit_rate"] / max(rr["prefix_cache_hit_rate"], 1e-9),
                         "mean_ttft_rr_over_prefix": rr["mean_ttft_ms"] / pa["mean_ttft_ms"]}  # fmt: skip
    if plot is not None:
        draw(results, plot)
    return results


def semantic_cache_quality() -> dict:
    """The semantic cache's hits on the labelled prompt pairs (`ember/gateway/cache_pairs.json`):
    false hits on different questions (the bar: 0), precision, and recall on same-question pairs."""
    from ember.gateway.cache_quality import labelled_pairs, match_quality

    return match_quality(labelled_pairs()).summary()


def run_with_progress(settings: GatewayBenchSettings, plot: Path | None = None) -> dict:
    """`run_gateway_bench` under its own progress bar (the standalone command)."""
    from rich.progress import Progress

    total = settings.documents * settings.questions * len(POLICIES) + settings.overhead_pairs + 2
    with Progress() as progress:
        task = progress.add_task("gateway bench", total=total)
        return run_gateway_bench(
            settings, tick=lambda text: progress.update(task, description=text), advance=lambda: progress.advance(task), plot=plot
        )


def markdown(results: dict) -> str:
    rr, pa, overhead = results["round_robin"], results["prefix_aware"], results["overhead"]
    workload = results["workload"]
    lines = [
        f"Shared-prefix workload: {workload['documents']} documents x {workload['questions']} questions "
        f"({workload['requests']} requests, ~{workload['doc_chars']} chars each), concurrency {workload['concurrency']}, "
        f"2 ember replicas of {Path(workload['model']).name}",
        "",
        "| routing | prefix-cache hit rate | mean TTFT ms | p50 TTFT ms | p99 TTFT ms |",
        "|---|---|---|---|---|",
    ]
    for name, row in (("round_robin", rr), ("prefix_aware", pa)):
        lines.append(f"| {name} | {row['prefix_cache_hit_rate']:.1%} | {row['mean_ttft_ms']:.0f} | {row['p50_ttft_ms']:.0f} | {row['p99_ttft_ms']:.0f} |")
    lines += [
        "",
        f"prefix-aware / round-robin hit rate: {results['ratios']['hit_rate_prefix_over_rr']:.2f}x; "
        f"round-robin / prefix-aware mean TTFT: {results['ratios']['mean_ttft_rr_over_prefix']:.2f}x",
        "",
        f"Gateway overhead ({overhead['pairs']} paired 1-token requests): added p50 {overhead['added']['p50_ms']:.2f} ms, "
        f"p99 {overhead['added']['p99_ms']:.2f} ms (direct p50 {overhead['direct']['p50_ms']:.1f} ms, "
        f"through the gateway p50 {overhead['gateway']['p50_ms']:.1f} ms)",
        "",
        *(semantic_cache_rows(results["semantic_cache"]) if "semantic_cache" in results else []),  # results saved before it
    ]
    return "\n".join(lines)


def semantic_cache_rows(quality: dict) -> list[str]:
    """The markdown table of the semantic cache's precision and recall on the labelled pairs."""
    return [
        f"Semantic cache on {quality['same_question_pairs'] + quality['different_question_pairs']} labelled prompt pairs "
        "(ember/gateway/cache_pairs.json; exact, then canonical-form match):",
        "",
        "| pairs | count | hits | rate |",
        "|---|---|---|---|",
        f"| same question (recall) | {quality['same_question_pairs']} | {quality['true_hits']} | {quality['recall']:.1%} |",
        f"| different question (false hits) | {quality['different_question_pairs']} | {quality['false_hits']} | "
        f"{quality['false_hits'] / quality['different_question_pairs']:.1%} |",
        f"| precision | | | {quality['precision']:.1%} |",
    ]


def draw(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (hits, ttft) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = list(POLICIES)
    hits.bar(names, [results[name]["prefix_cache_hit_rate"] * 100 for name in names], color=["#999999", "#d95f02"])
    hits.set_ylabel("prefix-cache hit rate (%)")
    ttft.bar(names, [results[name]["mean_ttft_ms"] for name in names], color=["#999999", "#d95f02"])
    ttft.set_ylabel("mean TTFT (ms)")
    figure.suptitle("ember gateway: prefix-aware vs round-robin, 2 replicas")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def dump(results: dict, path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
