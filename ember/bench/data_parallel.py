"""Data-parallel serving against one engine: `ember bench serve --data-parallel-size D`.

Two `ember serve` processes of the same model run side by side: one engine kept to one replica's share of the
cores (`--data-parallel-size 1 --data-parallel-cpus SHARE`), and D replicas each on a share of the same size
(`--data-parallel-size D --data-parallel-cpus D SHARES`). Each repeat sends one serve workload (a new seed per
repeat, so no prefix cache serves a repeat from the one before) to the one engine and then to the replicas, while
the other server idles; the report gives each side's served output tok/s and the ratio within each repeat, whose
ideal is D. Both API processes run unpinned.

It also gives the CPU the engines got (CPU seconds of the engine processes per wall second, from /proc): the ratio
can only reach D where the machine gives D replicas D times one engine's CPU. On a machine shared with other
sessions under the kernel's autogroup scheduling (sched_autogroup_enabled), CPU is shared per session, not per
process: the replicas together then get about what one engine got, and the ratio stays near 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import httpx

from ember.bench.results import RunResult
from ember.bench.serve import SLO, ember_server, run_load, serve_summary
from ember.bench.stats import spread
from ember.bench.suite import BenchOptions, make_workload


def replica_shares(size: int, cores: list[int]) -> tuple[str, str]:
    """The cores of one engine and of `size` replicas, as --data-parallel-cpus lists: every replica as many cores as
    the one engine (the whole machine's count divided by `size`, at least one)."""
    per_replica = max(1, len(cores) // size)
    if per_replica * size > len(cores):
        raise ValueError(f"--data-parallel-size {size} needs {size} cores to give each replica its own; this process "
                         f"has {len(cores)} ({cores})")
    return ",".join(map(str, cores[:per_replica])), ",".join(map(str, cores[: per_replica * size]))


def bench_data_parallel(options: BenchOptions, size: int, concurrency: int | None, dtype: str, max_prompt: int,
                        max_output: int, slo: SLO) -> dict:
    """Served output tok/s of `size` replicas against one engine on the same workloads (see the module's text)."""
    if size < 2:
        raise ValueError("--data-parallel-size must be at least 2 to compare replicas with one engine")
    one_cpus, all_cpus = replica_shares(size, sorted(os.sched_getaffinity(0)))
    num_requests = options.requests(64, "serve")
    sides = {
        "one_engine": ("--data-parallel-size", "1", "--data-parallel-cpus", one_cpus),
        "data_parallel": ("--data-parallel-size", str(size), "--data-parallel-cpus", all_cpus),
    }
    runs: dict[str, list] = {name: [] for name in sides}
    engine_cores: dict[str, list[float]] = {name: [] for name in sides}
    options.tick(f"serve -dp {size}: starting one engine on cores {one_cpus} and {size} replicas on cores {all_cpus}")
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(ember_server(options.model, dtype, flags)) for name, flags in sides.items()}
        for repeat in range(options.repeats):
            workload = make_workload(options, "serve", seed_offset=repeat, num_requests=num_requests,
                                     max_prompt=max_prompt, max_output=max_output)
            for name, url in urls.items():
                options.tick(f"serve -dp {size}: {name} ({repeat + 1}/{options.repeats})")
                run, cores_used = _measured_run(url, workload, concurrency, name)
                runs[name].append(run)
                engine_cores[name].append(cores_used)
    summaries = {name: [serve_summary(run, slo) for run in results] for name, results in runs.items()}
    tok_s = {name: [summary["output_tok_s"] for summary in items] for name, items in summaries.items()}
    return {
        "data_parallel_size": size,
        "cores": {"one_engine": one_cpus, "data_parallel": all_cpus},
        "num_requests": num_requests,
        "concurrency": concurrency,
        "max_prompt_tokens": max_prompt,
        "max_output_tokens": max_output,
        "tok_s": {name: spread(values).to_dict() for name, values in tok_s.items()},
        "mean_ttft_ms": {name: spread([s["ttft"].get("mean_ms", 0.0) for s in items]).to_dict()
                         for name, items in summaries.items()},
        "ratio": _per_repeat_ratio(tok_s),
        "engine_cores_used": {name: spread(values).to_dict() for name, values in engine_cores.items()},
        "engine_cores_ratio": _per_repeat_ratio(engine_cores),
        "errors": {name: sum(s["errors"] for s in items) for name, items in summaries.items()},
    }


def _measured_run(url: str, workload, concurrency: int | None, label: str) -> tuple[RunResult, float]:
    """One load run against the server at `url`, and the CPU cores its engine processes used meanwhile."""
    engine_pids = [replica["pid"] for replica in httpx.get(f"{url}/health", timeout=30).json()["replicas"]]
    cpu_before_s = sum(map(process_cpu_s, engine_pids))
    run = asyncio.run(run_load(url, workload, None, concurrency, label=label))
    return run, (sum(map(process_cpu_s, engine_pids)) - cpu_before_s) / run.wall_s


def _per_repeat_ratio(values: dict[str, list[float]]) -> dict:
    """The spread of data_parallel / one_engine, taken within each repeat."""
    pairs = zip(values["one_engine"], values["data_parallel"], strict=True)
    return spread([replicas / one if one else 0.0 for one, replicas in pairs]).to_dict()


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
