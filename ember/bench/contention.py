"""`ember bench contention`: throughput alone and beside a neighbour competing for the CPUs, same run.

Batch-1 decode and `mixed` output tok/s through the engine at its default configuration (threads,
wait policy and all), measured in rounds that alternate the conditions (alone; beside one
busy-looping process; beside a second ember engine decoding in a loop), so a machine whose other
load drifts during the run shifts every condition alike. Each condition's figure is the median of
its rounds, and the ratio to the quiet figure is what the goal reads: a fair share of two equal
competitors is 0.5x, the target 0.4x.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ember.bench.ember_runner import EmberSettings, run_ember
from ember.bench.stats import ratio, spread
from ember.bench.workloads import batch1, mixed

CONDITIONS = ("quiet", "busy-loop", "ember-engine")
TARGET_RATIO = 0.4
NEIGHBOUR_READY_TIMEOUT_S = 600.0

BUSY_LOOP = "while True:\n    pass\n"
# A second engine: loads, says so, then decodes one stream after another until killed.
ENGINE_LOOP = textwrap.dedent("""
    import sys
    from ember import LLM, SamplingParams
    llm = LLM(sys.argv[1], dtype=sys.argv[2])
    params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.0)
    llm.generate(["warm up"], params)
    print("ready", flush=True)
    while True:
        llm.generate(["Once upon a time"], params)
""")


@contextmanager
def neighbour(condition: str, model: str, dtype: str) -> Iterator[None]:
    """Run `condition`'s competing process (none for quiet) while the block runs; the engine one only once it has loaded."""
    if condition == "quiet":
        yield
        return
    if condition == "busy-loop":
        process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    else:
        process = subprocess.Popen([sys.executable, "-c", ENGINE_LOOP, model, dtype], stdout=subprocess.PIPE, text=True)
        line = process.stdout.readline() if process.stdout else ""
        if line.strip() != "ready":
            process.kill()
            raise RuntimeError(f"the neighbouring ember engine did not start (exit code {process.poll()})")
    try:
        yield
    finally:
        process.kill()
        process.wait()


def bench_contention(model: str, dtype: str, repeats: int, num_requests: int, seed: int,
                     tick: Callable[[str], None] = lambda _: None) -> dict:
    """Rounds of (quiet, busy loop, second engine) x (batch1, mixed); medians and ratios to quiet."""
    from ember.bench.ember_runner import loaded_weights
    from ember.bench.suite import token_source

    settings = EmberSettings()
    source = token_source(model)
    workloads = {"batch1": batch1(source, seed, prompt_len=32, output_len=64),
                 "mixed": mixed(source, seed, num_requests=num_requests, max_prompt=256, max_output=64)}
    loaded_weights(model, dtype)
    figures: dict[str, dict[str, list[float]]] = {c: {w: [] for w in workloads} for c in CONDITIONS}
    for round_index in range(repeats):
        for condition in CONDITIONS:
            with neighbour(condition, model, dtype):
                for name, workload in workloads.items():
                    tick(f"round {round_index + 1}/{repeats}: {name} {condition}")
                    figures[condition][name].append(run_ember(model, dtype, workload, settings).output_tok_s)
    return _section(figures, model, dtype, repeats)


def _section(figures: dict[str, dict[str, list[float]]], model: str, dtype: str, repeats: int) -> dict:
    rows = {}
    for name in figures["quiet"]:
        quiet = spread(figures["quiet"][name])
        rows[name] = {condition: {"output_tok_s": spread(values[name]).to_dict(),
                                  "ratio_to_quiet": ratio(spread(values[name]).median, quiet.median)}
                      for condition, values in figures.items()}
    return {"model": model, "dtype": dtype, "repeats": repeats, "target_ratio": TARGET_RATIO, "workloads": rows}


def format_contention_section(section: dict) -> str:
    """The table: per workload and condition, median output tok/s [min-max], ratio to quiet, goal met."""
    lines = [f"contention: {section['model']} ({section['dtype']}), default engine configuration, "
             f"{section['repeats']} alternating round(s); target: each neighbour >= {section['target_ratio']}x quiet",
             f"{'workload':<8} {'condition':<13} {'output tok/s (median [min-max])':<34} {'vs quiet':>8}"]
    for name, conditions in section["workloads"].items():
        for condition, row in conditions.items():
            figure = row["output_tok_s"]
            share = row["ratio_to_quiet"]
            verdict = "" if condition == "quiet" else ("  met" if share is not None and share >= section["target_ratio"] else "  MISSED")
            lines.append(f"{name:<8} {condition:<13} {figure['median']:>8.1f} [{figure['min']:.1f}-{figure['max']:.1f}]"
                         f"{'':<14} {share if share is not None else float('nan'):>7.2f}x{verdict}")
    return "\n".join(lines)
