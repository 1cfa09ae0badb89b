"""From one `bench all` results dict to summary.json, PNG plots and BENCHMARKS.md.

Rendering is pure: it reads the results dict only, so a report can be regenerated (or tested)
from a saved results file without running anything.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ember.bench.formatting import fmt, fmt_ratio, fmt_spread
from ember.bench.goals import Goal, feature_goals
from ember.bench.stats import ratio
from ember.bench.suite import PEERS, BenchOptions

GOALS = (
    # (key, what, target text, test on the measured value)
    ("mixed_f32_hf", "`mixed` float32: ember / HF transformers output tok/s", ">= 5x", lambda v: v >= 5.0),
    ("mixed_f32_llamacpp", "`mixed` float32: ember / llama.cpp output tok/s", ">= 1.5x", lambda v: v >= 1.5),
    ("mixed_bf16_hf", "`mixed` bfloat16: ember / HF transformers output tok/s", ">= 5x", lambda v: v >= 5.0),
    ("mixed_bf16_llamacpp", "`mixed` bfloat16: ember / llama.cpp output tok/s", ">= 1.5x", lambda v: v >= 1.5),
    ("batch1_roofline", "`batch1` float32: decode tok/s as % of the memory roofline", ">= 90%", lambda v: v >= 90.0),
    ("batch1_bf16_over_f32", "`batch1` bfloat16 over ember's float32: decode tok/s", ">= 1.8x", lambda v: v >= 1.8),
    ("shared_prefix_ttft", "`shared-prefix`: mean TTFT, prefix caching off / on", ">= 5x", lambda v: v >= 5.0),
    ("shared_prefix_reuse", "`shared-prefix`: prefix tokens served from the cache", ">= 90%", lambda v: v >= 90.0),
    ("long_prefill_p99", "`long-prefill`: decoders' p99 ITL, chunked prefill off / on", ">= 3x", lambda v: v >= 3.0),
    ("serve_batch1_tpot", "`serve` batch 1: TPOT served / offline (same request)", "<= 1.10x", lambda v: v <= 1.10),
    ("serve_streams", "`serve` 16 streams: output tok/s served / offline (same requests)", ">= 0.85x", lambda v: v >= 0.85),
    ("serve_batch1_e2e", "`serve` batch 1 end to end: tok/s of one whole answer, served / offline", ">= 0.9x", lambda v: v >= 0.9),
)


def _get(data: dict | None, *keys):
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def summary(results: dict) -> dict:
    """The headline figures in the shape issue 5 fixed (a peer or benchmark not run: null)."""
    mixed = {}
    for dtype in ("float32", "bfloat16"):
        entry = _get(results, "mixed", "dtype", dtype)
        mixed[dtype] = {
            "ember_tok_s": _get(entry, "ember", "tok_s", "median"),
            **{f"{peer}_tok_s": _get(entry, peer, "tok_s", "median") for peer in PEERS},
            **{f"ratio_{peer}": _get(entry, f"ratio_{peer}") for peer in PEERS},
        }
    batch1 = _get(results, "batch1", "dtype", "float32")
    return {
        "mixed": {"dtype": mixed},
        "batch1": {
            "ember_tok_s": _get(batch1, "ember", "decode_tok_s", "median"),
            "roofline_tok_s": _get(batch1, "roofline_tok_s"),
            "roofline_pct": _get(batch1, "roofline_pct"),
            **{f"{peer}_tok_s": _get(batch1, peer, "decode_tok_s", "median") for peer in PEERS},
        },
        "shared_prefix": {
            "ttft_ratio": _get(results, "shared_prefix", "ttft_ratio"),
            "prefix_reuse_pct": _get(results, "shared_prefix", "prefix_reuse_pct"),
        },
        "long_prefill": {"p99_itl_ratio": _get(results, "long_prefill", "p99_itl_ratio")},
        "serve": {
            "batch1_tpot_ratio": _get(results, "serve", "vs_offline", "batch1_tpot_ratio"),
            "tok_s_ratio": _get(results, "serve", "vs_offline", "tok_s_ratio"),
            "e2e_batch1_ratio": _get(results, "serve", "vs_offline", "e2e_batch1_ratio"),
        },
        "machine": results.get("machine", {}),
        "commit": results.get("commit", "unknown"),
    }


def goal_values(results: dict) -> dict[str, float | None]:
    s = summary(results)
    return {
        "mixed_f32_hf": s["mixed"]["dtype"]["float32"]["ratio_hf"],
        "mixed_f32_llamacpp": s["mixed"]["dtype"]["float32"]["ratio_llamacpp"],
        "mixed_bf16_hf": s["mixed"]["dtype"]["bfloat16"]["ratio_hf"],
        "mixed_bf16_llamacpp": s["mixed"]["dtype"]["bfloat16"]["ratio_llamacpp"],
        "batch1_roofline": s["batch1"]["roofline_pct"],
        "batch1_bf16_over_f32": ratio(_get(results, "batch1", "dtype", "bfloat16", "ember", "decode_tok_s", "median"),
                                      s["batch1"]["ember_tok_s"]),
        "shared_prefix_ttft": s["shared_prefix"]["ttft_ratio"],
        "shared_prefix_reuse": s["shared_prefix"]["prefix_reuse_pct"],
        "long_prefill_p99": s["long_prefill"]["p99_itl_ratio"],
        "serve_batch1_tpot": s["serve"]["batch1_tpot_ratio"],
        "serve_streams": s["serve"]["tok_s_ratio"],
        "serve_batch1_e2e": s["serve"]["e2e_batch1_ratio"],
    }


def all_goals(results: dict) -> list[Goal]:
    """The engine-speed goals (issue 9, on issue 5's workloads), then the done-when numbers of issues 10, 11 and 12 that the suite measures."""
    values = goal_values(results)
    engine = [Goal(9, what, target, values.get(key), test, unit="%" if target.endswith("%") else "x") for key, what, target, test in GOALS]
    return engine + feature_goals(results)


def write_summary(results: dict, path: Path) -> None:
    """summary.json: the headline figures, and every goal row with its computed verdict."""
    goals = [{"issue": g.issue, "goal": g.what, "target": g.target, "value": g.value, "verdict": g.verdict.strip("*")}
             for g in all_goals(results)]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(summary(results), goals=goals), indent=2) + "\n")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# -- plots ------------------------------------------------------------------------------------------


def make_plots(results: dict, folder: Path) -> dict[str, Path]:
    """PNG plots of what was measured; returns {name: path}. Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    mixed = _get(results, "mixed", "dtype")
    if mixed:
        plots["mixed"] = _bars(plt, folder / "mixed_throughput.png", "mixed: output tokens/s (median, min–max)", mixed,
                               ("ember", "ember_static", *PEERS), "tok_s")
    batch1 = _get(results, "batch1", "dtype")
    if batch1:
        plots["batch1"] = _bars(plt, folder / "batch1_decode.png", "batch1: decode tokens/s (median, min–max)", batch1,
                                ("ember", *PEERS), "decode_tok_s", roofline=True)
    shared = results.get("shared_prefix")
    if shared:
        plots["shared_prefix"] = _cdf(plt, folder / "shared_prefix_ttft_cdf.png", "shared-prefix: TTFT CDF",
                                      {f"prefix caching {k}": _pool(shared[k]["runs"], "ttft_s") for k in ("on", "off")}, "TTFT (s)")
    long = results.get("long_prefill")
    if long:
        plots["long_prefill"] = _cdf(plt, folder / "long_prefill_itl_cdf.png", "long-prefill: decoders' inter-token latency CDF",
                                     {long[k]["label"]: _pool(long[k]["runs"], "itl_s", "decoder") for k in ("on", "off")}, "ITL (s)", log=True)
    serve = results.get("serve")
    if serve and serve.get("runs"):
        plots["serve"] = _cdf(plt, folder / "serve_latency_cdf.png", f"serve: {serve['target']}",
                              {"TTFT": _pool(serve["runs"], "ttft_s"), "ITL": _pool(serve["runs"], "itl_s", "main")}, "seconds", log=True)
    soak = results.get("soak")
    if soak and soak.get("samples"):
        from ember.bench.soak import plot_soak

        plots["soak"] = folder / "soak_memory.png"
        plot_soak(soak, plots["soak"])
    languages = _get(results, "tokenizers", "language_costs")
    if languages and languages.get("rows"):
        from ember.bench.tokenizer_languages import PLOT_NAME, plot_language_costs

        plots["tokenizer_languages"] = plot_language_costs(languages, folder / PLOT_NAME)
    from ember.bench.report_features import make_feature_plots

    plots.update(make_feature_plots(results, folder))
    return plots


def _pool(runs: list[dict], key: str, role: str | None = None) -> list[float]:
    values: list[float] = []
    for run in runs:
        data = run.get(key, [])
        values.extend(data.get(role, []) if role is not None else data)
    return values


LABELS = {"ember": "ember", "ember_static": "ember, static batches", "ember_kv": "ember, --kv-cache-dtype",
          "hf": "HF transformers", "llamacpp": "llama.cpp", "vllm": "vLLM"}


def _bars(plt, path: Path, title: str, by_dtype: dict, engines: tuple[str, ...], metric: str, roofline: bool = False) -> Path:
    dtypes = list(by_dtype)
    present = [e for e in engines if any(e in by_dtype[d] for d in dtypes)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(present) + roofline)
    for i, engine in enumerate(present):
        medians, low, high = [], [], []
        for d in dtypes:
            s = _get(by_dtype[d], engine, metric) or {"median": 0, "min": 0, "max": 0}
            medians.append(s["median"])
            low.append(s["median"] - s["min"])
            high.append(s["max"] - s["median"])
        xs = [x + i * width for x in range(len(dtypes))]
        ax.bar(xs, medians, width, yerr=[low, high], capsize=3, label=LABELS.get(engine, engine))
    if roofline:
        xs = [x + len(present) * width for x in range(len(dtypes))]
        ax.bar(xs, [by_dtype[d].get("roofline_tok_s", 0) for d in dtypes], width, label="memory roofline", color="lightgray", hatch="//")
    ax.set_xticks([x + width * (len(present) + roofline - 1) / 2 for x in range(len(dtypes))], dtypes)
    ax.set_ylabel("tokens/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf(plt, path: Path, title: str, series: dict[str, list[float]], xlabel: str, log: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        if not values:
            continue
        ordered = sorted(values)
        ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=f"{label} (n={len(ordered)})")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of samples")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- BENCHMARKS.md -----------------------------------------------------------------------------


def render_markdown(results: dict, plots: dict[str, Path] | None = None, report_dir: Path | None = None) -> str:
    """BENCHMARKS.md from a results dict; plot links are made relative to `report_dir`."""
    plots = plots or {}
    lines: list[str] = []
    add = lines.append
    add("# ember benchmarks")
    add("")
    add("<!-- Generated by `ember bench all --report BENCHMARKS.md`. Do not edit by hand: rerun the command. -->")
    add("")
    add(f"Measured {results.get('started_at', '?')} – {results.get('finished_at', '?')} on {describe_tree(results.get('commit', 'unknown'))} "
        f"with model `{_get(results, 'options', 'model')}`. Command:")
    add("")
    add("```")
    add(results.get("command", "ember bench all --report BENCHMARKS.md"))
    add("```")
    add("")
    _updates(lines, results)
    options = results.get("options", {})
    repeats = f"{options.get('repeats', '?')} runs" + (
        f" (a re-measured section: its command's --repeats, {BenchOptions.repeats} if not given)" if results.get("updates") else "")
    scale = f"{options.get('scale', 1.0)}" + (" (a re-measured section: by its command's --scale)" if results.get("updates") else "")
    add(f"Every figure is the median of {repeats}, with (min–max); ratios are ratios of medians. "
        f"Request counts are scaled by {scale} relative to issue 5{_overrides(options)} "
        "(prompt and output lengths are as specified) to keep the whole suite within about half an hour on this machine. "
        "Absolute numbers hold for this machine only.")
    for note in results.get("notes", []):
        add("")
        add(f"> {note}")
    add("")
    _machine(lines, results)
    _goals(lines, results)
    _skipped(lines, results)
    _roofline(lines, results)
    _mixed(lines, results, plots, report_dir)
    _batch1(lines, results, plots, report_dir)
    _shared_prefix(lines, results, plots, report_dir)
    _long_prefill(lines, results, plots, report_dir)
    _serve(lines, results, plots, report_dir)
    _peer_settings(lines, results)
    _soak(lines, results, plots, report_dir)
    _tokenizers(lines, results, plots, report_dir)
    _gateway(lines, results)
    _features(lines, results, plots, report_dir)
    _closing(lines, results)
    return "\n".join(lines).rstrip() + "\n"


def _updates(lines: list[str], results: dict) -> None:
    """Which sections a later run re-measured (`ember bench all --update-results`), and with what."""
    updates = results.get("updates") or []
    if not updates:
        return
    lines += ["Sections re-measured after that run (every other section is from the command above):", ""]
    for update in updates:
        load = update.get("load_average_during") or {}
        load_text = f", load average {load['mean']} (max {load['max']})" if load else ""
        sections = ", ".join(f"`{name}`" for name in update["sections"])
        lines.append(f"- {sections}: {update['started_at']} – {update['finished_at']} on {describe_tree(update['commit'])}"
                     f"{load_text}{_other_cpu(update, results)}, by `{update['command']}`")
    lines.append("")


def _other_cpu(update: dict, results: dict) -> str:
    """A warning when an update ran on a CPU other than the one in the Machine table (its numbers are not comparable)."""
    cpu, base = update.get("cpu") or {}, results.get("machine", {})
    if not cpu or (cpu.get("cpu_model"), cpu.get("cpu_flags")) == (base.get("cpu_model"), base.get("cpu_flags")):
        return ""
    return (f", **on another CPU than the Machine table's** ({cpu.get('cpu_model')}; "
            f"SIMD flags {', '.join(cpu.get('cpu_flags', []))}: compare its figures with each other, not with other sections)")


def describe_tree(commit: str) -> str:
    """'commit `abc` (clean tree)', or the commit with the hash of the uncommitted diff it ran with."""
    base, _, dirty = commit.partition("+dirty")
    if base == "unknown":
        return "an unknown commit (not a git checkout)"
    if not dirty:
        return f"commit `{base}` (clean tree)"
    digest = dirty.lstrip(".")
    return f"commit `{base}` **with uncommitted changes** (diff sha256 `{digest or 'not recorded'}`)"


def _overrides(options: dict) -> str:
    counts = options.get("requests") or {}
    if not counts:
        return ""
    return " (" + ", ".join(f"`{name}`: {n} requests" for name, n in counts.items()) + ")"


def _img(lines: list[str], plots: dict[str, Path], key: str, report_dir: Path | None) -> None:
    if key not in plots:
        return
    path = plots[key]
    if report_dir is not None:
        with contextlib.suppress(ValueError):  # a plot outside the report's folder keeps its absolute path
            path = path.resolve().relative_to(report_dir.resolve())
    lines += ["", f"![{key}]({path.as_posix()})"]


def _machine(lines: list[str], results: dict) -> None:
    m = results.get("machine", {})
    lines += ["## Machine", ""]
    rows = [
        ["CPU", str(m.get("cpu_model"))],
        ["CPU flags (SIMD)", ", ".join(m.get("cpu_flags", [])) or "n/a"],
        ["logical CPUs / torch threads", f"{m.get('logical_cpus')} / {m.get('torch_threads')}"],
        ["memory", f"{m.get('memory_gib')} GiB"],
        ["OS / Python", f"{m.get('os')} / {m.get('python')}"],
        ["torch / transformers / llama-cpp-python", f"{m.get('torch')} / {m.get('transformers')} / {m.get('llama_cpp_python') or 'not installed'}"],
        ["load average (1, 5, 15 min) at start / end", f"{m.get('load_average_at_start')} / {m.get('load_average_at_end')}"],
    ]
    if m.get("llama_cpp_system_info"):
        features = m["llama_cpp_system_info"].replace("|", ",").strip(" ,")  # a pipe would split the table cell
        rows.append(["llama.cpp build (its system info)", f"`{features}`"])
    during = m.get("load_average_during")
    if during:
        rows.append(["1-min load average while measuring", f"mean {during['mean']}, max {during['max']} ({during['samples']} samples)"])
    lines += _table(["", ""], rows)
    if during and m.get("logical_cpus") and during["mean"] > 1.5 * m["logical_cpus"]:
        lines += ["", f"**Other processes shared this machine's {m['logical_cpus']} CPUs while it was measured** (load average "
                  f"{during['mean']} on average): every absolute figure below is lower than on an idle machine, and ratios "
                  "carry more noise than their min–max suggests."]
    lines.append("")


def _goals(lines: list[str], results: dict) -> None:
    lines += ["## Goals", "",
              "Where ember stands against the goals of issue 9 (engine speed, on issue 5's workloads) and the done-when numbers of issues 10 (quantization), "
              "11 (speculative decoding) and 12 (parallelism) that this suite measures. Every verdict is computed from the "
              "numbers below; 'reported' rows are numbers an issue asks for without a threshold.", ""]
    rows = [[str(goal.issue), goal.what, goal.target, goal.measured, goal.verdict] for goal in all_goals(results)]
    lines += _table(["issue", "goal", "target", "measured", ""], rows)
    lines.append("")


def _skipped(lines: list[str], results: dict) -> None:
    skipped = results.get("skipped", {})
    errors = results.get("errors", {})
    if not skipped and not errors:
        return
    lines += ["## Not run", ""]
    for name, why in skipped.items():
        lines.append(f"- **{name}**: {why}")
    for name, why in errors.items():
        lines.append(f"- **{name}** failed: `{why}`")
    lines.append("")


def _roofline(lines: list[str], results: dict) -> None:
    r = results.get("roofline")
    if not r:
        return
    lines += ["## Roofline (`ember bench roofline`)", ""]
    rows = [
        ["memory read bandwidth", f"{fmt_spread(r['bandwidth_gb_s'], 2)} GB/s", r["method"] + f", {r['threads']} threads, {r['array_bytes'] / 2**30:.0f} GiB array"],
        ["matmul float32", f"{fmt(r['matmul_gflops'].get('float32'))} GFLOP/s", "torch.mm 1024x1024"],
        ["matmul bfloat16", f"{fmt(r['matmul_gflops'].get('bfloat16'))} GFLOP/s", "torch.mm 1024x1024"],
    ]
    for dtype, per_token in r.get("bytes_per_token", {}).items():
        rows.append([f"bytes read per decoded token ({dtype})", f"{per_token / 1e6:.0f} MB",
                     f"roofline {fmt(r['roofline_tok_s'][dtype])} tok/s at batch 1; {describe_decode_bytes(_get(r, 'decode_bytes', dtype))}"])
    lines += _table(["", "value", "how"], rows)
    lines.append("")


def roofline_percent(entry: dict, engine: str) -> float:
    """An engine's batch1 decode as % of the memory roofline: ember's paired per run where measured so, else its median
    against the dtype's roofline."""
    if engine == "ember" and "roofline_pct" in entry:
        return entry["roofline_pct"]
    return 100.0 * entry[engine]["decode_tok_s"]["median"] / entry["roofline_tok_s"]


def describe_decode_bytes(step: dict | None) -> str:
    """'weights 538 MB (tied embedding counted once, as the LM head) + KV 1.2 MB at 192 cached tokens'."""
    if not step:
        return "weights only (KV not counted)"
    embedding = "tied embedding read whole, as the LM head" if step["tied_embeddings"] else "untied embedding: one row per token"
    return (f"weights {step['weight_bytes'] / 1e6:.0f} MB ({embedding}) + KV cache {step['kv_bytes'] / 1e6:.1f} MB "
            f"at {step['context_len']} cached tokens ({step['kv_bytes_per_token']:,} bytes per token)")


def _mixed(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    section = results.get("mixed")
    if not section:
        return
    static = section.get("static_batch_size")
    static_text = f"once fed static batches of {static} (at least two batches, so the lever has something to change)" if static else "(no static lever: a single request)"
    lines += ["## `mixed`: throughput", "",
              f"{section['num_requests']} requests arriving at once, {section['prompt_tokens']} prompt and "
              f"{section['output_tokens']} output tokens in all (lengths {section['workload'].get('distribution', '')}). "
              "HF runs `generate()` in static batches of 16 with left padding: its output tok/s counts each request's own target only, "
              "its computed tok/s every token it generated, padding included; "
              "llama.cpp runs 16 parallel sequences through its batched API; vLLM (its CPU build, in its own environment) runs every "
              "request through one `LLM.generate` call with its own scheduler's defaults; "
              f"ember runs once with continuous batching and {static_text}. "
              "Peer settings are listed under 'Peer settings'.", ""]
    rows = []
    notes = []
    for dtype, entry in section["dtype"].items():
        for engine in ("ember", "ember_static", *PEERS):
            if engine not in entry:
                continue
            record = entry[engine]
            ratio = "1.00x" if engine == "ember" else fmt_ratio(_ratio_of(entry, engine))
            computed = fmt_spread(record["computed_tok_s"]) if "computed_tok_s" in record else "= output"
            waste = (f"{record['output_padding_waste_pct']:.0f}% of generated, {record['prompt_padding_waste_pct']:.0f}% of prompt"
                     if "output_padding_waste_pct" in record else "none")
            steps = ", ".join(str(n) for n in record.get("num_steps", [])) or "—"
            rows.append([dtype, LABELS[engine], fmt_spread(record["tok_s"]), computed, waste, steps, ratio])
        if "static_dropped" in entry:
            notes.append(f"{dtype}: static-batches row dropped: {entry['static_dropped']}.")
    lines += _table(["dtype", "engine", "output tok/s", "computed tok/s", "padding waste", "engine steps (per repeat)", "ember / this"], rows)
    lines += [f"\n{note}" for note in notes]
    _img(lines, plots, "mixed", report_dir)
    lines.append("")


def _ratio_of(entry: dict, engine: str) -> float | None:
    ember = _get(entry, "ember", "tok_s", "median")
    other = _get(entry, engine, "tok_s", "median")
    return None if not other or ember is None else ember / other


def _batch1(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    section = results.get("batch1")
    if not section:
        return
    w = section["workload"]
    lines += ["## `batch1`: single-stream decode", "",
              f"One {w.get('prompt_len')}-token prompt, {w.get('output_len')} tokens out. Decode tok/s counts the tokens after the first "
              "over the time after the first (vLLM's: timed as its engine loop's streamed deltas come back); end-to-end tok/s "
              "includes the prefill. "
              f"Roofline: memory bandwidth / bytes read per token ({describe_decode_bytes(_get(section, 'dtype', 'float32', 'decode_bytes'))} "
              f"in float32); {_batch1_bandwidth(section)}.", ""]
    rows = []
    for dtype, entry in section["dtype"].items():
        for engine in ("ember", *PEERS):
            if engine not in entry:
                continue
            decode = entry[engine]["decode_tok_s"]
            rows.append([dtype, LABELS[engine], fmt_spread(decode), fmt_spread(entry[engine]["tok_s"]), f"{roofline_percent(entry, engine):.0f}%"])
        rows.append([dtype, "memory roofline", fmt(entry["roofline_tok_s"]), "", "100%"])
    lines += _table(["dtype", "engine", "decode tok/s", "end-to-end tok/s", "% of roofline"], rows)
    _img(lines, plots, "batch1", report_dir)
    lines.append("")


def _batch1_bandwidth(section: dict) -> str:
    """Where batch1's roofline bandwidth came from: probes around ember's runs (per dtype), or one figure."""
    probed = {dtype: entry["bandwidth_gb_s"] for dtype, entry in section["dtype"].items() if "probes_gb_s" in entry}
    if not probed:
        return f"bandwidth {section['bandwidth_gb_s']:.2f} GB/s"
    figures = ", ".join(f"{dtype} {fmt_spread(gb_s, 2)} GB/s" for dtype, gb_s in probed.items())
    return ("every repeat runs each dtype's engines one after the other, and the bandwidth is probed right before and right "
            "after each of ember's runs; ember's % is the median over its runs of its decode rate against its own two probes' "
            f"mean, the peers' their median against the roofline shown (the median of those means: {figures})")


def _shared_prefix(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    s = results.get("shared_prefix")
    if not s:
        return
    w = s["workload"]
    lines += ["## `shared-prefix`: prefix caching", "",
              f"{s['num_requests']} requests arriving at once, each a shared {w.get('prefix_len')}-token system prompt plus a distinct "
              f"{w.get('question_len')}-token question, {w.get('output_len')} tokens out ({s['dtype']}). "
              "Reuse = prompt tokens served from the prefix cache / all requests' prefix tokens (the first request cannot reuse).", ""]
    rows = [[f"prefix caching {k}", fmt_spread(s[k]["mean_ttft_s"], 3), fmt_spread(s[k]["tok_s"]), fmt_spread(s[k]["prefix_reuse_pct"])] for k in ("on", "off")]
    lines += _table(["ember", "mean TTFT (s)", "output tok/s", "prefix reuse %"], rows)
    lines += ["", f"Mean TTFT off / on: **{fmt_ratio(s.get('ttft_ratio'))}**."]
    _img(lines, plots, "shared_prefix", report_dir)
    lines.append("")


def _long_prefill(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    s = results.get("long_prefill")
    if not s:
        return
    w = s["workload"]
    lines += ["## `long-prefill`: chunked prefill", "",
              f"{w.get('num_decoders')} decoders ({w.get('decoder_prompt_len')}-token prompts, {w.get('decoder_output_len')} tokens out) "
              f"while {w.get('num_long')} prompts of {w.get('long_prompt_len')} tokens arrive, spread over the decoders' run ({s['dtype']}). "
              f"Chunked prefill on uses a {s['chunk_tokens']}-token step budget; off needs a budget that holds a whole prompt ({s['off_budget_tokens']}).", ""]
    rows = [[s[k]["label"], fmt_spread(s[k]["p50_itl_ms"]), fmt_spread(s[k]["p99_itl_ms"]), fmt_spread(s[k]["max_itl_ms"]),
             fmt_spread(s[k]["long_ttft_ms"], 0), fmt_spread(s[k]["tok_s"])] for k in ("on", "off")]
    lines += _table(["ember", "decoder ITL p50 (ms)", "p99 (ms)", "max (ms)", "long prompts' TTFT (ms)", "output tok/s"], rows)
    lines += ["", f"Decoders' p99 ITL off / on: **{fmt_ratio(s.get('p99_itl_ratio'))}** (p50: {fmt_ratio(s.get('p50_itl_ratio'))})."]
    _img(lines, plots, "long_prefill", report_dir)
    lines.append("")


def _serve(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    s = results.get("serve")
    if not s:
        return
    rate = "all at once" if s.get("request_rate") is None else f"Poisson at {s['request_rate']} req/s"
    lines += ["## `serve`: HTTP load against an OpenAI-compatible server", "",
              f"{s['num_requests']} mixed-like requests per run ({rate}, at most {s.get('concurrency')} in flight) streamed from "
              f"`/v1/completions` of {s['target']}; a new seed per repeat. Goodput: requests/s with TTFT <= {s['slo']['ttft_ms']:.0f} ms "
              f"and TPOT <= {s['slo']['tpot_ms']:.0f} ms.", ""]
    headers, rows = serve_table(s)
    lines += _table(headers, rows)
    for peer in _served_peers(s):
        lines.append(f"\nSame requests, same run, against `{LABELS[peer]} serve` of the same weights: ember / {LABELS[peer]} output tok/s "
                     f"{fmt_ratio(s.get(f'ratio_{peer}'))}.")
    _serve_vs_offline(lines, s.get("vs_offline"))
    _img(lines, plots, "serve", report_dir)
    lines.append("")


SERVE_METRICS = (("output tok/s", "tok_s", 1), ("mean TTFT (ms)", "mean_ttft_ms", 0), ("p99 TTFT (ms)", "p99_ttft_ms", 0),
                 ("mean TPOT (ms)", "mean_tpot_ms", 1), ("p99 ITL (ms)", "p99_itl_ms", 1), ("goodput (req/s)", "goodput_req_s", 2))


def serve_table(section: dict) -> tuple[list[str], list[list[str]]]:
    """The serve section's headers and rows, for the report and the terminal: a column per server (ember's, then the
    peers' started beside it), and where a peer ran it, each server's TPOT of one batch1 request alone."""
    servers = [section, *(section[peer] for peer in _served_peers(section))]
    rows = [[label, *(fmt_spread(server[key], digits) for server in servers)] for label, key, digits in SERVE_METRICS]
    rows.append(["failed requests", *(str(server.get("errors", 0)) for server in servers)])
    if len(servers) > 1:
        ember_tpot = _get(section, "vs_offline", "batch1_tpot_ms", "served")
        rows.append(["TPOT (ms), one `batch1` request alone", fmt_spread(ember_tpot), *(fmt_spread(s["batch1_tpot_ms"]) for s in servers[1:])])
    return ["", section["target"], *(f"{LABELS[peer]} serve" for peer in _served_peers(section))], rows


def _served_peers(section: dict) -> list[str]:
    return [peer for peer in PEERS if peer in section]


def _serve_vs_offline(lines: list[str], compared: dict | None) -> None:
    if not compared:
        return
    lines += ["", "The served path against the same engine offline (`LLM`'s engine in the bench process), same requests, same run:", ""]
    rows = [
        ["output tok/s, the load above", fmt_spread(compared["tok_s"]["served"]), fmt_spread(compared["tok_s"]["offline"]),
         fmt_ratio(compared.get("tok_s_ratio"))],
        ["TPOT (ms), one `batch1` request alone", fmt_spread(compared["batch1_tpot_ms"]["served"]),
         fmt_spread(compared["batch1_tpot_ms"]["offline"]), fmt_ratio(compared.get("batch1_tpot_ratio"))],
    ]
    if "e2e_batch1_tok_s" in compared:
        rows.append(["tok/s end to end, one whole 96-token answer to a short prompt", fmt_spread(compared["e2e_batch1_tok_s"]["served"]),
                     fmt_spread(compared["e2e_batch1_tok_s"]["offline"]), fmt_ratio(compared.get("e2e_batch1_ratio"))])
    lines += _table(["", "served", "offline", "served / offline"], rows)


def _peer_settings(lines: list[str], results: dict) -> None:
    """How each engine ran, as recorded by its runner (attention kernel, KV cache, threads, batching)."""
    found: dict[str, dict] = {}
    for section in ("mixed", "batch1"):
        for dtype, entry in (_get(results, section, "dtype") or {}).items():
            for engine in PEERS:
                settings = _get(entry, engine, "settings")
                if settings:
                    found.setdefault(f"{LABELS[engine]}, `{section}` {dtype}", settings)
    if not found:
        return
    lines += ["## Peer settings", "", "Read back from each peer as it ran:", ""]
    rows = [[where, ", ".join(f"{key}: {value}" for key, value in settings.items())] for where, settings in found.items()]
    lines += _table(["peer", "settings"], rows)
    lines.append("")


def _gateway(lines: list[str], results: dict) -> None:
    if not results.get("gateway"):
        return
    from ember.bench.gateway import markdown

    lines += ["## Gateway routing (`ember bench gateway`)", "", markdown(results["gateway"]), ""]
def _soak(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    from ember.bench.soak import summary_rows

    s = results.get("soak")
    if not s:
        return
    settings = s["settings"]
    lines += ["## `soak`: nothing lost under load", "",
              f"{s['num_requests']} mixed requests ({settings['concurrency']} in flight, {settings['cancel_fraction']:.0%} abandoned "
              f"mid-answer by their client, max_tokens up to {settings['max_tokens']}) against {s['target']}: chat and text, streamed "
              "or whole, n up to 3, stop strings, seeds, logprobs, batched and token-id prompts. Lost = neither complete nor "
              "cancelled by its client.", ""]
    lines += _table(["", "measured"], [[measure, value] for measure, value in summary_rows(s)])
    _img(lines, plots, "soak", report_dir)
    lines.append("")


def _tokenizers(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    t = results.get("tokenizers")
    if not t:
        return
    lines += ["## Tokenizers (`ember bench tokenizers`)", ""]
    if isinstance(t, dict) and isinstance(t.get("markdown"), str):
        lines.append(t["markdown"])
    else:
        lines += ["```json", json.dumps(t, indent=2, default=str)[:6000], "```"]
    _img(lines, plots, "tokenizer_languages", report_dir)
    lines.append("")


def _bottleneck(profile: dict) -> str:
    """One sentence naming where a decode step's time goes, from the profile."""
    overhead = profile.get("python_overhead_pct") or 0.0
    top = profile.get("top") or [{"name": "?", "pct": 0.0}]
    step = f"a decode step took {profile.get('step_ms', 0):.0f} ms"
    if overhead >= 30.0:
        return (f"Bottleneck: {step}, and {overhead:.0f}% of it was spent outside torch operators (Python scheduling, "
                f"bookkeeping, sampling, tensor setup); of the operator time, `{top[0]['name']}` took the largest share ({top[0]['pct']:.0f}%).")
    return (f"Bottleneck: {step}; {100 - overhead:.0f}% of it inside torch operators, led by `{top[0]['name']}` "
            f"({top[0]['pct']:.0f}% of operator time).")


def _features(lines: list[str], results: dict, plots: dict, report_dir: Path | None) -> None:
    """The spec, quant, parallel, structured and lora sections (ember.bench.report_features), each with its PNG if it has one."""
    from ember.bench.report_features import (
        lora_markdown,
        parallel_markdown,
        prefix_markdown,
        quant_markdown,
        spec_markdown,
        structured_markdown,
    )

    def image(section_lines: list[str], key: str) -> None:
        _img(section_lines, plots, key, report_dir)

    lines += spec_markdown(results.get("spec"), _table, image)
    lines += quant_markdown(results.get("quant"), _table, image)
    lines += parallel_markdown(results.get("parallel"), image)
    lines += structured_markdown(results.get("structured"))
    lines += prefix_markdown(results.get("prefix"))
    lines += lora_markdown(results.get("lora"))


def _closing(lines: list[str], results: dict) -> None:
    missed = [goal.what for goal in all_goals(results) if goal.is_missed]
    profile = results.get("profile")
    lines += ["## Closing note", ""]
    if not missed:
        lines.append("Every goal that could be measured here was met.")
    else:
        lines.append("Missed: " + "; ".join(missed) + ".")
    if profile:
        lines += ["", f"Profile of ember ({profile.get('what')}): share of self CPU time by operator, top {len(profile.get('top', []))}:", ""]
        lines += _table(["operator", "self CPU %", "calls"], [[f"`{op['name']}`", f"{op['pct']:.1f}", str(op["calls"])] for op in profile.get("top", [])])
        lines += ["", _bottleneck(profile)]
    for note in results.get("closing_notes", []):
        lines += ["", note]
    lines.append("")
