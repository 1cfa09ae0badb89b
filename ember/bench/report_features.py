"""The `spec`, `quant` and `parallel` sections of BENCHMARKS.md and their plots, from the results dict only.

The PNGs are the ones the benches draw themselves (acceptance histogram, perplexity against
bytes), redrawn here from the saved section so that `--from-results` can re-render them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from ember.bench.goals import quant_row
from ember.bench.parallel_modes import PARALLEL_MODES
from ember.bench.spec import acceptance_text, ceiling_text, draft_lengths_text

Table = Callable[[list[str], list[list[str]]], list[str]]
Image = Callable[[list[str], str], None]


def make_feature_plots(results: dict, folder: Path) -> dict[str, Path]:
    """{name: PNG} for the feature sections present in `results`."""
    plots: dict[str, Path] = {}
    if results.get("spec", {}).get("batch1"):
        from ember.bench.spec import plot_acceptance

        plots["spec"] = plot_acceptance(results["spec"], folder / "spec_acceptance.png")
    if results.get("quant", {}).get("rows"):
        from ember.bench.quant import plot_quant

        plots["quant"] = plot_quant(results["quant"], folder / "quant.png")
        for also in results["quant"].get("also", []):
            plots[quant_plot_key(also)] = plot_quant(also, folder / f"{quant_plot_key(also)}.png")
    if results.get("parallel", {}).get("modes"):
        plots["parallel"] = plot_parallel(results["parallel"], folder / "parallel.png")
    return plots


def plot_parallel(section: dict, path: Path) -> Path:
    """Weights per rank of each mode against whole / ranks, and run time of one process against each mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 2**20
    modes = section["modes"]
    first = next(iter(modes.values()))
    fig, (memory, timing) = plt.subplots(1, 2, figsize=(9, 3.6))
    width = 0.8 / max(1, len(modes))
    for i, (mode, run) in enumerate(modes.items()):
        ranks = [b / mib for b in run["rank_weight_bytes"]]
        memory.bar([r + i * width for r in range(len(ranks))], ranks, width, label=PARALLEL_MODES.get(mode, mode))
    memory.axhline(first["whole_weight_bytes"] / mib / first["world_size"], color="gray", linestyle="--",
                   label=f"whole model / {first['world_size']}")  # fmt: skip
    memory.set_xticks([r + width * (len(modes) - 1) / 2 for r in range(first["world_size"])],
                      [f"rank {r}" for r in range(first["world_size"])])  # fmt: skip
    memory.set_ylabel("weights (MiB)")
    memory.set_title("weights held per rank")
    memory.legend(fontsize=8)
    runs = {"1 process": first["single_s"], **{PARALLEL_MODES.get(mode, mode): run["parallel_s"] for mode, run in modes.items()}}
    medians = [statistics.median(v) for v in runs.values()]
    errors = [[m - min(v) for m, v in zip(medians, runs.values(), strict=True)],
              [max(v) - m for m, v in zip(medians, runs.values(), strict=True)]]  # fmt: skip
    timing.bar(list(runs), medians, yerr=errors, capsize=3, color=["tab:gray", "tab:orange", "tab:green", "tab:red", "tab:purple"][: len(runs)])
    timing.tick_params(axis="x", labelsize=7)
    timing.set_ylabel("seconds per run (median, min–max)")
    timing.set_title("same prompts, same run")
    fig.suptitle(f"parallel modes on {first['model'].split('/')[-1]}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sizes_note(sizes: dict | None) -> str:
    """'Sized for this run: prompts 1 (full size 3), ...' from a section's {'used', 'full'} sizes."""
    if not sizes:
        return ""
    changed = [f"{name.replace('_', ' ')} {_text(value)} (full size {_text(sizes['full'].get(name))})"
               for name, value in sizes["used"].items() if value != sizes["full"].get(name)]  # fmt: skip
    if not changed:
        return "Run at full size."
    return "Scaled down for this run: " + "; ".join(changed) + "."


def _text(value) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


# -- spec ------------------------------------------------------------------------------------------


def structured_markdown(section: dict | None) -> list[str]:
    """The structured-outputs section: what holding replies to JSON costs, and whether the replies conform."""
    if not section:
        return []
    from ember.bench.structured import format_structured_section, section_batches

    batches = section_batches(section)
    output_len = next(iter(batches.values()))["workload"]["output_len"]
    return ["## `structured`: structured outputs (`ember bench structured`)", "",
            f"One engine per variant, batch {' and '.join(batches)}, greedy, dtype {section['dtype']}, chat "
            f"prompts asking for an item as JSON, at most {output_len} tokens each: free text, `json_object`, a "
            "`json_schema` of the fields asked for through each backend (ember's own engine, xgrammar, llguidance), a "
            "GBNF grammar of the same fields through xgrammar and llguidance, and the schema on an engine that ran the "
            "workload once untimed (served before: its prompts come from the prefix cache, only its decode compares), "
            "without and with n-gram speculation (batch 1), same run, interleaved repeats "
            f"({section['repeats']}). Masks are computed during the forward pass; forced tokens are appended without a "
            "model step (jump-forward). A fresh engine per run: a cold first request's TTFT includes building the "
            "backend's vocabulary, and ember's decode the masks of states met first. Finished replies (ended before the "
            "token limit) are checked (jsonschema, or the grammar's language) from the last repeat.",
            "", format_structured_section(section), ""]  # fmt: skip


def prefix_markdown(section: dict | None) -> list[str]:
    """The prefix-cache section: how many prompt tokens each cache serves, and what that does to TTFT."""
    if not section:
        return []
    from ember.bench.prefix import format_prefix_section

    return ["## `prefix`: radix-tree vs block-hash prefix cache (`ember bench prefix`)", "",
            f"One engine per cache and repeat, dtype {section['dtype']}, greedy, {section['output_len']} tokens per reply; "
            "requests arrive in rounds (the next once the last has finished) and the cache lives across rounds. "
            "Multi-turn: each turn's prompt is its conversation so far, turns of uneven length; few-shot: one "
            "instruction, four of eight examples in a random order, a question; shared-prefix: the suite's workload. "
            "Served: prompt tokens taken from the cache (share of all prompt tokens). TTFT: mean over a run's requests, "
            f"median (min-max) of {section['repeats']} interleaved repeats.",
            "", format_prefix_section(section), ""]  # fmt: skip


def lora_markdown(section: dict | None) -> list[str]:
    """The multi-LoRA section: what serving adapters costs against the base model, same run."""
    if not section:
        return []
    from ember.bench.lora import format_lora_section

    workload = section["workload"]
    return ["## `lora`: multi-LoRA serving (`ember bench lora`)", "",
            f"The `mixed` workload ({workload['num_requests']} requests, greedy, ignore_eos) on the model's {section['dtype']} "
            f"weights: the base model alone, then an engine serving up to 16 adapters whose requests take 0, 1, 4 or 16 "
            f"distinct random adapters (round robin) of rank 8 and 64 over every attention and MLP linear, held in "
            f"{section['adapter_dtype']}; a fresh engine per run, interleaved repeats ({section['repeats']}).",
            "", format_lora_section(section), ""]  # fmt: skip


def spec_markdown(section: dict | None, table: Table, image: Image) -> list[str]:
    if not section:
        return []
    draft = (f"; draft: `{Path(section['draft_model']).name}` at dtype {section['draft_dtype']}"
             f"{' (its own 4-bit blocks: a self-draft)' if section['draft_dtype'] == 'auto' else ''}"
             if section.get("draft_model") else "")  # fmt: skip
    if section.get("medusa_heads"):
        draft += f"; Medusa heads: `{Path(section['medusa_heads']).name}` (trained on the model's replies to prompts from the shared corpus unless given)"
    if section.get("eagle_head"):
        draft += f"; EAGLE-style head: `{Path(section['eagle_head']).name}` (trained on the model's replies to prompts from the shared corpus unless given)"
    lines = ["## `spec`: speculative decoding (`ember bench spec`)", "",
             f"ember with each proposer against ember without, same run, interleaved repeats ({section.get('repeats', '?')}), "
             f"greedy, target dtype {section['dtype']}, {draft_lengths_text(section)} with adaptive K{draft}. "
             "Output tok/s counts prefill; decode tok/s the tokens after the first over the time after the first. "
             f"{sizes_note(section.get('sizes'))}", ""]
    lines += ["Batch 1:", ""]
    lines += _batch1_table(section["batch1"], table)
    lines += _ceilings(section["batch1"])
    lines += _sibling(section.get("sibling"), table)
    lines += _sweep(section, table)
    mixed = section.get("mixed")
    if mixed:
        lines += ["", f"Inside `mixed` ({mixed['num_requests']} requests, continuous batching): plain {_spread(mixed['plain']['tok_s'])} "
                  f"tok/s, n-gram {_spread(mixed['ngram']['tok_s'])} tok/s, **{_ratio(mixed['ngram'].get('ratio'))}** "
                  f"(acceptance {mixed['ngram']['acceptance_rate']:.0%})."]
    image(lines, "spec")
    lines.append("")
    return lines


def _batch1_table(batch1: dict, table: Table) -> list[str]:
    rows = []
    for workload, entry in batch1.items():
        for method, data in entry.items():
            if method == "plain" or not isinstance(data, dict) or "tok_s" not in data:
                continue
            rows.append([workload, _lengths(entry.get("prompt_len")), method, _spread(entry["plain"]["tok_s"]), _spread(data["tok_s"]),
                         _ratio(data.get("ratio")), _ratio(data.get("decode_ratio")), acceptance_text(data),
                         f"{data['mean_accepted_length']:.2f}", f"{data['draft_time_s']:.2f}", f"{data['verify_time_s']:.2f}"])
    return table(["workload", "prompt tokens", "proposer", "plain tok/s", "with proposer tok/s", "over plain", "decode over plain",
                  "acceptance", "mean accepted length", "draft s", "verify s"], rows)


def _ceilings(batch1: dict) -> list[str]:
    """The prompt-lookup ceiling of each workload, where the run measured it."""
    found = [f"{workload} {ceiling}" for workload, entry in batch1.items() if (ceiling := ceiling_text(entry))]
    if not found:
        return []
    return ["", "Prompt-lookup ceiling: at each decode step of the plain run's own greedy output, an oracle drafts the "
            "continuation of whichever earlier occurrence of the newest token the target then keeps longest; its tokens "
            "per step bound any n-gram proposer's decode speed-up at that depth (a verification costs at least a decode "
            "step), and applied to the plain run's decode share of its time, the output tok/s ratio: " + "; ".join(found) + "."]


def _sibling(sibling: dict | None, table: Table) -> list[str]:
    if not sibling:
        return []
    return ["", f"Batch 1 with a larger target and its smaller sibling as draft model: target `{Path(sibling['target']).name}`, "
            f"draft `{Path(sibling['draft']).name}`, both at dtype {sibling['dtype']} (same workloads, rendered with the target's "
            f"tokenizer and chat template; {sibling.get('repeats', '?')} interleaved repeats):", "", *_batch1_table(sibling["batch1"], table),
            *_ceilings(sibling["batch1"])]


def _sweep(section: dict, table: Table) -> list[str]:
    sweep = section.get("batch_sweep") or {}
    if not sweep:
        return []
    rows = [[batch, _spread(entry["plain"]["tok_s"]), _spread(entry["ngram"]["tok_s"]), _ratio(entry["ngram"].get("ratio")),
             f"{entry['ngram']['acceptance_rate']:.0%}"] for batch, entry in sorted(sweep.items(), key=lambda item: int(item[0]))]
    crossover = section.get("crossover_batch")
    where = "n-gram still pays at every batch swept" if crossover is None else f"n-gram stops paying at batch {crossover}"
    return ["", "Batch sweep on code-edit (n-gram):", "",
            *table(["batch", "plain tok/s", "n-gram tok/s", "over plain", "acceptance"], rows), "", f"Crossover: {where}."]


# -- quant -----------------------------------------------------------------------------------------


def _windows(section: dict) -> str:
    """How perplexity was measured: tokens and windows, and what the ± after each change means."""
    windows = section.get("eval_windows")
    if not windows:
        return f"{section['eval_tokens']} tokens, one window"
    return (f"{section['eval_tokens']} tokens in {windows} consecutive windows of {section['eval_tokens'] // windows}, NLL pooled; "
            "the ± after a change is its standard error across the windows, from the spread of the per-window ratios to float32")


def quant_plot_key(section: dict) -> str:
    """The plot name of a further model's quant table (its file name without the extension)."""
    return "quant_" + "".join(c if c.isalnum() else "_" for c in Path(section["model"]).name)


def quant_markdown(section: dict | None, table: Table, image: Image) -> list[str]:
    if not section:
        return []
    lines = ["## `quant`: quantization methods (`ember bench quant`)", ""]
    lines += _quant_table(section, table)
    image(lines, "quant")
    lines.append("")
    if section.get("w8a8_kernels"):
        lines += ["W8A8 (SmoothQuant) product paths on this model's layer shapes, microseconds per call (median), same run: "
                  "the compiled kernel, the plain-torch fallback (exact float32 GEMM on codes), torch's `_int_mm` (each with "
                  "per-token rounding and scaling), float32 `F.linear` for scale.", ""]
        from ember.bench.w8a8_kernels import COLUMNS, table_cells

        lines += table(list(COLUMNS), [table_cells(r) for r in section["w8a8_kernels"]])
        lines.append("")
    for also in section.get("also", []):
        lines += [f"### `{Path(also['model']).name}`", ""]
        lines += _quant_table(also, table)
        image(lines, quant_plot_key(also))
        lines.append("")
    return lines


# A checkpoint held in fewer bytes per parameter than this is quantized (bfloat16 holds 2).
QUANTIZED_BYTES_PER_PARAMETER = 1.5


def _requantization_note(section: dict) -> str:
    """Where the checkpoint is itself quantized, what its float32 model is, and what that does to the methods' rows."""
    stored = quant_row(section, "checkpoint as stored")
    if stored is None or stored["bytes_per_parameter"] >= QUANTIZED_BYTES_PER_PARAMETER:
        return ""
    return (f"The checkpoint is quantized ({stored['bytes_per_parameter']:.3f} bytes/param as stored), so the float32 model "
            "is its blocks dequantized and every method re-quantizes weights that already sit on the checkpoint's own "
            "grid: a method whose grid differs (other groups, other levels) adds its rounding to the checkpoint's, "
            "which float weights would not show. ")


def _quant_table(section: dict, table: Table) -> list[str]:
    from ember.bench.quant import change_cell

    float_row = quant_row(section, "float32")
    lines = [f"`{Path(section['model']).name}`: each method quantizes the float32 model (group size {section.get('group_size', '?')} "
             "where the method takes one; each row names its own), "
             f"calibrated on `{Path(section['calib']).name}` ({section['calib_tokens']} tokens); perplexity on "
             f"`{Path(section['eval']).name}` ({_windows(section)}). Bytes per parameter: the weights as "
             "held in memory (nominal: each group's scales counted once, as the format defines them). Decode tok/s: median single-stream step rate after a 64-token prompt (one run per row). "
             f"{_requantization_note(section)}{sizes_note(section.get('sizes'))}", ""]
    lines += [f"Not run on this model: {name} ({why})." for name, why in section.get("not_run", {}).items()]
    rows = []
    for row in section["rows"]:
        speed = row["decode_tok_s"] / float_row["decode_tok_s"] if float_row and float_row["decode_tok_s"] else None
        nominal = row.get("nominal_bytes_per_parameter")
        rows.append([row["name"], f"{row['perplexity']:.3f}", change_cell(row), f"{row['bytes_per_parameter']:.3f}",
                     "n/a" if nominal is None else f"{nominal:.3f}", f"{row['decode_tok_s']:.1f}", _ratio(speed),
                     f"{row['quantize_s']:.0f}" if row.get("quantize_s") else ""])  # fmt: skip
    return lines + table(["weights", "perplexity", "vs float32", "bytes/param in memory", "nominal bytes/param", "decode tok/s",
                          "decode over float32", "quantize s"], rows)  # fmt: skip


# -- parallel --------------------------------------------------------------------------------------


def parallel_markdown(section: dict | None, image: Image) -> list[str]:
    if not section:
        return []
    from ember.bench.parallel import markdown

    lines = ["## `parallel`: parallel modes against one process (`ember bench parallel`)", ""]
    for mode, run in section["modes"].items():
        w = run["workload"]
        table = markdown(run).split("\n", 1)[1]  # its own heading names the engine's mode, which says nothing of SP
        lines += [f"### {PARALLEL_MODES.get(mode, mode)}, {run['world_size']} ranks, vs one process", table, "",
                  f"{w['prompts']} prompt(s) of {w['prompt_len']} random tokens, {w['max_tokens']} out (greedy), {w['repeats']} repeats "
                  f"of each engine, --dtype {run.get('dtype', 'float32')} on both sides.", ""]  # fmt: skip
    for mode, error in section.get("errors", {}).items():
        lines += [f"- **{mode}** failed: `{error}`", ""]
    lines.append(f"{section.get('torch_threads', '?')} torch threads on one shared CPU box, shared out over the ranks: they compete for "
                 "the same cores, so parallel runs add work and cannot speed up here; the modelled row says what tensor parallel's "
                 "traffic would cost on fast links. "
                 f"{'' if 'expert' in section['modes'] else 'Expert parallel needs an MoE model: not run here. '}"
                 f"{sizes_note(section.get('sizes'))}")
    image(lines, "parallel")
    lines.append("")
    return lines


def _lengths(value) -> str:
    """A workload's prompt length(s): '376', or '350–402' over several prompts."""
    if isinstance(value, list) and value:
        return str(value[0]) if min(value) == max(value) else f"{min(value)}–{max(value)}"
    return "?" if value is None or value == [] else str(value)


def _spread(data: dict | None) -> str:
    return "n/a" if not data else f"{data['median']:,.1f} ({data['min']:,.1f}–{data['max']:,.1f})"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
