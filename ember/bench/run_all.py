"""`ember bench all`: every benchmark that can run here, then results JSON, plots, summary and report."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from ember.bench import report, suite
from ember.bench.feature_benches import FEATURE_SECTIONS, FeatureSizes, run_feature_section
from ember.bench.feature_benches import planned_runs as feature_planned_runs
from ember.bench.machine import git_commit, load_average, machine_info
from ember.bench.suite import BenchOptions

SECTIONS = ("roofline", "mixed", "batch1", "shared-prefix", "long-prefill", "serve", "soak", "tokenizers", "gateway", *FEATURE_SECTIONS)


def run_all(options: BenchOptions, command: str, report_path: Path | None, out_dir: Path, only: tuple[str, ...] = SECTIONS,
            profile: bool = True, tokenizer_text_mb: float = 2.0, feature_sizes: FeatureSizes | None = None,
            base_results: dict | None = None) -> dict:
    """Run the benchmarks in `only`; write out_dir/results/<stamp>.json, summary.json, plots and the report.

    `feature_sizes` sizes spec, quant and parallel (default: FeatureSizes.for_scale(options.scale)).
    `base_results` (a saved results file's content): keep its other sections and replace only those
    in `only`, recording this run as an update so the report names the command behind each section.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    started = time.gmtime()
    feature_sizes = feature_sizes or FeatureSizes.for_scale(options.scale)
    options.workload_dir = out_dir / "workloads"
    results: dict = {
        "command": command,
        "started_at": time.strftime("%Y-%m-%d %H:%M UTC", started),
        "commit": git_commit(),
        "machine": machine_info(),
        "options": {"model": options.model, "dtypes": list(options.dtypes), "repeats": options.repeats, "seed": options.seed,
                    "scale": options.scale, "requests": options.requests_by_workload, "peers": list(options.peers),
                    "chunk_tokens": options.chunk_tokens, "static_dtypes": list(options.static_dtypes or options.dtypes),
                    "feature_sizes": asdict(feature_sizes)},
        "skipped": options.skipped,
        "errors": {},
        "notes": [],
        "closing_notes": [],
    }
    total = sum(_planned_runs(options, feature_sizes, name) for name in only) + 4
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()) as progress:
        task = progress.add_task("ember bench all", total=total)

        loads: list[float] = []

        def tick(description: str) -> None:
            progress.update(task, description=description, advance=1)
            load = load_average()
            if load:
                loads.append(load[0])
            if not progress.console.is_terminal:  # a log file gets one line per step instead of a live bar
                progress.console.print(f"[{time.strftime('%H:%M:%S')}] {description}")

        options.tick = tick
        for name in only:
            key = name.replace("-", "_")
            try:
                if name == "roofline":
                    results[key] = suite.bench_roofline(options)
                elif name == "mixed":
                    results[key] = suite.bench_mixed(options)
                elif name == "batch1":
                    results[key] = suite.bench_batch1(options)
                elif name == "shared-prefix":
                    results[key] = suite.bench_shared_prefix(options)
                elif name == "long-prefill":
                    results[key] = suite.bench_long_prefill(options)
                elif name == "serve":
                    results[key] = suite.bench_serve(options)
                elif name == "gateway":
                    from ember.bench.gateway import GatewayBenchSettings, run_gateway_bench

                    settings = GatewayBenchSettings(model=options.model, seed=options.seed,
                                                    overhead_pairs=max(20, round(200 * options.scale)))  # fmt: skip
                    results[key] = run_gateway_bench(settings, tick=tick)
                elif name == "soak":
                    results[key] = suite.bench_soak(options)
                elif name == "tokenizers":
                    tick("tokenizers")
                    outcome = run_tokenizer_bench_if_present(options, tokenizer_text_mb)
                    if outcome is None:
                        options.skipped["tokenizers"] = "ember/bench/tokenizers.py (run_tokenizer_bench) is not present"
                    else:
                        results[key] = outcome
                elif name in FEATURE_SECTIONS:
                    results[key] = run_feature_section(name, options, feature_sizes)
            except Exception as error:  # noqa: BLE001 - one broken benchmark must not lose the others' results
                results["errors"][name] = f"{type(error).__name__}: {error}"[:500]
                traceback.print_exc()
        if profile and base_results is None and _any_goal_missed(results):
            tick("profiling ember")
            try:
                results["profile"] = _profile(options)
            except Exception as error:  # noqa: BLE001
                results["errors"]["profile"] = f"{type(error).__name__}: {error}"[:500]
    results["machine"]["load_average_at_end"] = load_average()
    if loads:
        results["machine"]["load_average_during"] = {"mean": round(sum(loads) / len(loads), 2), "max": max(loads), "samples": len(loads)}
    results["finished_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if base_results is not None:
        results = merge_update(base_results, results, only)
    _write(results, options, report_path, out_dir, started)
    return results


def merge_update(base: dict, update: dict, only: tuple[str, ...]) -> dict:
    """`base` with the sections in `only` taken from `update` (dropped where the update has none), and the update recorded."""
    merged = dict(base)
    for name in only:
        key = name.replace("-", "_")
        if key in update:
            merged[key] = update[key]
        else:
            merged.pop(key, None)
    merged["errors"] = {name: e for name, e in base.get("errors", {}).items() if name not in only} | update["errors"]
    merged["skipped"] = {name: why for name, why in base.get("skipped", {}).items() if name not in only} | {
        name: why for name, why in update.get("skipped", {}).items() if name in only}
    record = {field: update[field] for field in ("command", "commit", "started_at", "finished_at")}
    record["sections"] = list(only)
    record["load_average_during"] = update["machine"].get("load_average_during")
    record["cpu"] = {field: update["machine"][field] for field in ("cpu_model", "cpu_flags") if field in update["machine"]}
    merged["updates"] = [*base.get("updates", []), record]
    return merged


def _planned_runs(options: BenchOptions, feature_sizes: FeatureSizes, name: str) -> int:
    if name in FEATURE_SECTIONS:
        return feature_planned_runs(options, feature_sizes, name)
    return suite.planned_runs(options, name)


def run_tokenizer_bench_if_present(options: BenchOptions, text_mb: float = 2.0):
    """ember/bench/tokenizers.py's `run_tokenizer_bench` (another module's), or None where it is absent."""
    if importlib.util.find_spec("ember.bench.tokenizers") is None:
        return None
    module = importlib.import_module("ember.bench.tokenizers")
    bench = getattr(module, "run_tokenizer_bench", None)
    if bench is None:
        return None
    from ember.bench.workloads import find_corpus_dir

    corpus = find_corpus_dir()
    if corpus is None:
        raise FileNotFoundError("the tokenizer benchmark needs the shared assets (../shared or $EMBER_SHARED)")
    accepted = inspect.signature(bench).parameters
    candidates = {"shared_dir": corpus.parent, "repeats": options.repeats, "seed": options.seed, "text_bytes": int(text_mb * 1e6)}
    outcome = bench(**{name: value for name, value in candidates.items() if name in accepted})
    if isinstance(outcome, str):
        return {"markdown": outcome}
    formatter = getattr(module, "format_markdown", None)
    if formatter is not None and isinstance(outcome, dict):
        outcome = dict(outcome, markdown=formatter(outcome).replace("## ", "### ", 1))
    return outcome


def _any_goal_missed(results: dict) -> bool:
    return any(goal.is_missed for goal in report.all_goals(results))


def _profile(options: BenchOptions) -> dict:
    from ember.bench.profile import profile_ember

    return profile_ember(suite.model_path(options.model).as_posix(), options.dtypes[0])


def rerender(results_file: Path, report_path: Path | None, out_dir: Path) -> None:
    """Summary, plots and report from a saved results file, measuring nothing (e.g. after a renderer fix)."""
    if not results_file.is_file():
        raise FileNotFoundError(f"results file {results_file} does not exist; see {out_dir / 'results'}")
    results = json.loads(results_file.read_text())
    _render(results, report_path, out_dir)


def _write(results: dict, options: BenchOptions, report_path: Path | None, out_dir: Path, started) -> None:
    results_dir = out_dir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", started)
    (results_dir / f"{stamp}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    _render(results, report_path, out_dir)


def _render(results: dict, report_path: Path | None, out_dir: Path) -> None:
    report.write_summary(results, out_dir / "results" / "summary.json")
    plots = report.make_plots(results, out_dir / "plots")
    if report_path is not None:
        report_path.write_text(report.render_markdown(results, plots, report_path.resolve().parent))
