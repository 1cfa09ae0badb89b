"""Terminal output of a benchmark section: the tokens/s, latencies and ratios, as rich tables."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table

from ember.bench.formatting import fmt, fmt_ratio, fmt_spread
from ember.bench.report import LABELS, describe_decode_bytes, roofline_percent, serve_table
from ember.bench.suite import PEERS


def print_section(name: str, section: dict, skipped: dict[str, str]) -> None:
    console = Console()
    printer = {
        "mixed": _mixed,
        "batch1": _batch1,
        "shared-prefix": _shared_prefix,
        "long-prefill": _long_prefill,
        "serve": _serve,
        "serve-data-parallel": _serve_data_parallel,
        "roofline": _roofline,
        "quant": _quant,
        "soak": _soak,
    }[name]
    console.print(printer(section))
    for peer, why in skipped.items():
        console.print(f"[yellow]skipped {peer}[/]: {why}")


def _mixed(section: dict) -> Group:
    table = Table(title=f"mixed: {section['num_requests']} requests, {section['output_tokens']} output tokens")
    for column in ("dtype", "engine", "output tok/s (median, min-max)", "computed tok/s (incl. padding)", "padding waste", "engine steps", "ember / this"):
        table.add_column(column)
    notes = []
    for dtype, entry in section["dtype"].items():
        ember = entry["ember"]["tok_s"]["median"]
        for engine in ("ember", "ember_static", *PEERS):
            if engine not in entry:
                continue
            record = entry[engine]
            other = record["tok_s"]["median"]
            computed = fmt_spread(record["computed_tok_s"]) if "computed_tok_s" in record else "= output"
            waste = (f"{record['output_padding_waste_pct']:.0f}% gen, {record['prompt_padding_waste_pct']:.0f}% prompt"
                     if "output_padding_waste_pct" in record else "none")
            steps = ",".join(str(n) for n in record.get("num_steps", [])) or "-"
            label = LABELS[engine] + (f" of {section['static_batch_size']}" if engine == "ember_static" else "")
            table.add_row(dtype, label, fmt_spread(record["tok_s"]), computed, waste, steps, fmt_ratio(ember / other if other else None))
        if "static_dropped" in entry:
            notes.append(f"[yellow]{dtype}: static-batches row dropped[/]: {entry['static_dropped']}")
    return Group(table, *notes, *_settings_lines(section))


def _quant(section: dict) -> Group:
    from ember.bench.quant import change_cell

    title = f"quant: perplexity on {section['eval']} ({section['eval_tokens']} tokens), calibrated on {section['calib']}"
    table = Table(title=title)
    for column in ("weights", "perplexity", "vs float", "bytes/param (memory)", "bytes/param (nominal)", "decode tok/s", "quantize s"):
        table.add_column(column)
    for row in section["rows"]:
        table.add_row(row["name"], f"{row['perplexity']:.2f}", change_cell(row), f"{row['bytes_per_parameter']:.3f}",
                      f"{row['nominal_bytes_per_parameter']:.3f}", f"{row['decode_tok_s']:.1f}", f"{row['quantize_s']:.0f}" if row["quantize_s"] else "")
    tables = [table]
    if section.get("w8a8_kernels"):
        from ember.bench.w8a8_kernels import COLUMNS as W8A8_COLUMNS
        from ember.bench.w8a8_kernels import table_cells as w8a8_cells

        kernels = Table(title="W8A8 products: microseconds per call (median), same run")
        for column in W8A8_COLUMNS:
            kernels.add_column(column)
        for row in section["w8a8_kernels"]:
            kernels.add_row(*w8a8_cells(row))
        tables.append(kernels)
    return Group(*tables)


def _settings_lines(section: dict) -> list[str]:
    lines = []
    for dtype, entry in section["dtype"].items():
        for engine in PEERS:
            settings = entry.get(engine, {}).get("settings")
            if settings:
                lines.append(f"{LABELS[engine]} ({dtype}): " + ", ".join(f"{key}={value}" for key, value in settings.items()))
    return lines


def _batch1(section: dict) -> Group:
    title = f"batch1 (memory bandwidth probed around ember's runs: median {section['bandwidth_gb_s']:.2f} GB/s)"
    if "ember_auto_vs_float32" in section:
        title += f"; ember auto (quantized) / float32 decode: {fmt_ratio(section['ember_auto_vs_float32'])}"
    table = Table(title=title)
    for column in ("dtype", "engine", "decode tok/s", "end-to-end tok/s", "% of roofline"):
        table.add_column(column)
    notes = []
    for dtype, entry in section["dtype"].items():
        for engine in ("ember", "ember_kv", *PEERS):
            if engine in entry:
                decode = entry[engine]["decode_tok_s"]
                table.add_row(dtype, LABELS[engine], fmt_spread(decode), fmt_spread(entry[engine]["tok_s"]),
                              f"{roofline_percent(entry, engine):.0f}%")
        table.add_row(dtype, "memory roofline", fmt(entry["roofline_tok_s"]), "", "100%")
        if "ratio_kv_cache" in entry:
            notes.append(f"{dtype}: decode with {entry['ember_kv']['settings']['kv_cache_dtype']} KV cache / default cache: "
                         f"{fmt_ratio(entry['ratio_kv_cache'])} (same run)")
        notes.append(f"roofline {dtype}: {describe_decode_bytes(entry.get('decode_bytes'))}")
    return Group(table, *notes, *_settings_lines(section))


def _shared_prefix(section: dict) -> Table:
    table = Table(title=f"shared-prefix: mean TTFT off/on {fmt_ratio(section['ttft_ratio'])}, prefix reuse {fmt(section['prefix_reuse_pct'])}%")
    for column in ("prefix caching", "mean TTFT s", "output tok/s", "prefix reuse %"):
        table.add_column(column)
    for key in ("on", "off"):
        table.add_row(key, fmt_spread(section[key]["mean_ttft_s"], 3), fmt_spread(section[key]["tok_s"]), fmt_spread(section[key]["prefix_reuse_pct"]))
    return table


def _long_prefill(section: dict) -> Table:
    table = Table(title=f"long-prefill: decoders' p99 ITL off/on {fmt_ratio(section['p99_itl_ratio'])}")
    for column in ("ember", "ITL p50 ms", "ITL p99 ms", "ITL max ms", "long TTFT ms", "output tok/s"):
        table.add_column(column)
    for key in ("on", "off"):
        s = section[key]
        table.add_row(s["label"], fmt_spread(s["p50_itl_ms"]), fmt_spread(s["p99_itl_ms"]), fmt_spread(s["max_itl_ms"]),
                      fmt_spread(s["long_ttft_ms"], 0), fmt_spread(s["tok_s"]))
    return table


def _serve_data_parallel(section: dict) -> Table:
    size = section["data_parallel_size"]
    table = Table(title=f"serve: {size} replicas vs one engine, {section['num_requests']} requests, concurrency "
                        f"{section['concurrency']} (same workloads, same run)")
    for column in ("", f"one engine (cores {section['cores']['one_engine']})",
                   f"{size} replicas (cores {section['cores']['data_parallel']})", f"replicas / one (ideal {size})"):
        table.add_column(column)
    table.add_row("output tok/s", fmt_spread(section["tok_s"]["one_engine"]), fmt_spread(section["tok_s"]["data_parallel"]),
                  fmt_spread(section["ratio"], 2))
    table.add_row("mean TTFT ms", fmt_spread(section["mean_ttft_ms"]["one_engine"], 0),
                  fmt_spread(section["mean_ttft_ms"]["data_parallel"], 0), "")
    cores = section["engine_cores_used"]
    table.add_row("engine CPU cores used", fmt_spread(cores["one_engine"], 2), fmt_spread(cores["data_parallel"], 2),
                  fmt_spread(section["engine_cores_ratio"], 2))
    table.add_row("failed requests", str(section["errors"]["one_engine"]), str(section["errors"]["data_parallel"]), "")
    return table


def _serve(section: dict) -> Table | Group:
    table = Table(title=f"serve: {section['target']}, {section['num_requests']} requests, concurrency {section['concurrency']}, median (min-max)")
    headers, rows = serve_table(section)
    for column in headers:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    peers = [f"same requests, same run: ember / {LABELS[peer]} output tok/s {fmt_ratio(section[f'ratio_{peer}'])}"
             for peer in PEERS if f"ratio_{peer}" in section]
    compared = section.get("vs_offline")
    if not compared:
        return Group(table, *peers)
    versus = Table(title="served vs offline (same requests, same run)")
    for column in ("", "served", "offline", "served / offline"):
        versus.add_column(column)
    versus.add_row("output tok/s (the load above)", fmt_spread(compared["tok_s"]["served"]), fmt_spread(compared["tok_s"]["offline"]),
                   fmt_ratio(compared.get("tok_s_ratio")))
    versus.add_row("TPOT ms (one batch1 request alone)", fmt_spread(compared["batch1_tpot_ms"]["served"]),
                   fmt_spread(compared["batch1_tpot_ms"]["offline"]), fmt_ratio(compared.get("batch1_tpot_ratio")))
    if "e2e_batch1_tok_s" in compared:
        versus.add_row("tok/s end to end (one whole 96-token answer)", fmt_spread(compared["e2e_batch1_tok_s"]["served"]),
                       fmt_spread(compared["e2e_batch1_tok_s"]["offline"]), fmt_ratio(compared.get("e2e_batch1_ratio")))
    return Group(table, *peers, versus)


def _soak(section: dict) -> Table:
    from ember.bench.soak import summary_rows

    table = Table(title=f"soak: {section['target']}")
    table.add_column("measure")
    table.add_column("value")
    for measure, value in summary_rows(section):
        table.add_row(measure, value)
    return table


def _roofline(section: dict) -> Table:
    table = Table(title="roofline")
    table.add_column("measure")
    table.add_column("value")
    table.add_row("memory read bandwidth", f"{fmt_spread(section['bandwidth_gb_s'], 2)} GB/s ({section['method']})")
    for dtype, gflops in section["matmul_gflops"].items():
        table.add_row(f"matmul {dtype}", f"{gflops:.1f} GFLOP/s")
    for dtype, tok_s in section["roofline_tok_s"].items():
        table.add_row(f"decode roofline {dtype}", f"{tok_s:.1f} tok/s ({section['bytes_per_token'][dtype] / 1e6:.0f} MB/token: "
                      f"{describe_decode_bytes(section.get('decode_bytes', {}).get(dtype))})")
    return table


def print_summary(results: dict) -> None:
    from ember.bench.report import all_goals

    console = Console()
    table = Table(title="ember bench all: goals")
    for column in ("issue", "goal", "target", "measured"):
        table.add_column(column)
    for goal in all_goals(results):
        style = {"met": "green", "**missed**": "red"}.get(goal.verdict, "")
        table.add_row(str(goal.issue), goal.what, goal.target, f"[{style}]{goal.measured}[/]" if style else goal.measured)
    console.print(table)
    for name, why in results.get("errors", {}).items():
        console.print(f"[red]{name} failed[/]: {why}")
    for name, why in results.get("skipped", {}).items():
        console.print(f"[yellow]skipped {name}[/]: {why}")
