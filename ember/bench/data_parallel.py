"""Data-parallel serving against one engine: `ember bench serve --data-parallel-size D`.

Two `ember serve` processes of the same model run side by side: one engine kept to one replica's share of the
cores (`--data-parallel-size 1 --data-parallel-cpus SHARE`), and D replicas each on a share of the same size
(`--data-parallel-size D --data-parallel-cpus D SHARES`). Each repeat sends one serve workload (a new seed per
repeat, so no prefix cache serves a repeat from the one before) to the one engine and then to the replicas, while
the other server idles; the report gives each side's served output tok/s and the ratio within each repeat, whose
ideal is D. Both API processes run unpinned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

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
    options.tick(f"serve -dp {size}: starting one engine on cores {one_cpus} and {size} replicas on cores {all_cpus}")
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(ember_server(options.model, dtype, flags)) for name, flags in sides.items()}
        for repeat in range(options.repeats):
            workload = make_workload(options, "serve", seed_offset=repeat, num_requests=num_requests,
                                     max_prompt=max_prompt, max_output=max_output)
            for name, url in urls.items():
                options.tick(f"serve -dp {size}: {name} ({repeat + 1}/{options.repeats})")
                runs[name].append(asyncio.run(run_load(url, workload, None, concurrency, label=name)))
    summaries = {name: [serve_summary(run, slo) for run in results] for name, results in runs.items()}
    ratios = [replicas.output_tok_s / one.output_tok_s if one.output_tok_s else 0.0
              for one, replicas in zip(runs["one_engine"], runs["data_parallel"], strict=True)]
    return {
        "data_parallel_size": size,
        "cores": {"one_engine": one_cpus, "data_parallel": all_cpus},
        "num_requests": num_requests,
        "concurrency": concurrency,
        "max_prompt_tokens": max_prompt,
        "max_output_tokens": max_output,
        "tok_s": {name: spread([s["output_tok_s"] for s in items]).to_dict() for name, items in summaries.items()},
        "mean_ttft_ms": {name: spread([s["ttft"].get("mean_ms", 0.0) for s in items]).to_dict()
                         for name, items in summaries.items()},
        "ratio": spread(ratios).to_dict(),
        "errors": {name: sum(s["errors"] for s in items) for name, items in summaries.items()},
    }
