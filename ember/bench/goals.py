"""The "done when" numbers of issues 10 (quantization), 11 (speculative decoding), 12 (parallelism) and 50
(multi-LoRA) that `ember bench all` measures, as rows of the report's Goals table.

Every verdict is computed from the results dict; a row whose numbers were not measured says so.
Rows whose issue sets no target (scaling on a 2-core box, acceptance rates) are reported as such.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ember.bench.parallel_modes import PARALLEL_MODES, padding
from ember.bench.spec import NEVER_DRAFTED, acceptance_text, ceiling_text
from ember.bench.spec_workloads import CONTROL_WORKLOADS

# The bounds ember states for "every method within a stated bound of the float model" (issue 10):
# perplexity over the float32 model's, in percent, on the report's evaluation corpus.
PPL_BOUND_PCT = {4: 10.0, 8: 1.0}
SEED_MEMORY_RATIO = 3.5  # the seed's "~3.5x less memory" for 4-bit weights
RANK_SHARE_SLACK = 1.15  # "memory per rank ~1/T": replicated norms and KV heads may add up to 15%


@dataclass(frozen=True)
class Goal:
    """One row of the Goals table: what is measured, the target, the value and how it is judged."""

    issue: int
    what: str
    target: str
    value: float | None
    test: Callable[[float], bool] | None = None  # None: the issue asks for the number, not a threshold
    unit: str = "x"  # "x" (ratio), "%", "+%" (a signed change) or "" (a plain number)
    detail: str = ""  # where the number came from, or what goes with it

    @property
    def measured(self) -> str:
        if self.value is None:
            return "not measured"
        text = {"x": f"{self.value:.2f}x", "%": f"{self.value:.1f}%", "+%": f"{self.value:+.1f}%"}.get(self.unit, f"{self.value:g}")
        return f"{text} ({self.detail})" if self.detail else text

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "—"
        if self.test is None:
            return "reported"
        return "met" if self.test(self.value) else "**missed**"

    @property
    def is_missed(self) -> bool:
        return self.value is not None and self.test is not None and not self.test(self.value)


def _get(data, *keys):
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def feature_goals(results: dict) -> list[Goal]:
    return quant_goals(results) + spec_goals(results) + parallel_goals(results) + lora_goals(results)


# -- issue 50: multi-LoRA ---------------------------------------------------------------------------


def lora_goals(results: dict) -> list[Goal]:
    """16 distinct rank-8 adapters against the base model, same run (issue 50); nothing where lora did not run."""
    section = results.get("lora")
    if not section:
        return []
    detail = f"{section['adapter_dtype']} adapters on the {section['dtype']} base, {section['workload']['num_requests']} requests"
    return [Goal(50, "`lora` 16 distinct rank-8 adapters: `mixed` output tok/s over the base model", ">= 0.8x",
                 _get(section, "variants", "16 adapters, rank 8", "over_base"), lambda v: v >= 0.8, detail=detail)]


# -- issue 11: speculative decoding -----------------------------------------------------------------


def spec_goals(results: dict) -> list[Goal]:
    section = results.get("spec")
    batch1 = _get(section, "batch1") or {}
    goals = []
    for workload, entry in batch1.items():
        if workload in CONTROL_WORKLOADS:
            continue
        detail = "; ".join(filter(None, (_acceptance(entry, "ngram"), ceiling_text(entry))))
        goals.append(Goal(11, f"`spec` batch 1 greedy, {workload}: n-gram output tok/s over plain", ">= 2x",
                          _get(entry, "ngram", "ratio"), lambda v: v >= 2.0, detail=detail))
    for method, name in (("draft", "draft-model"), ("medusa", "Medusa"), ("eagle", "EAGLE-style")):
        for workload, entry in batch1.items():
            if method in entry:
                goals.append(Goal(11, f"`spec` batch 1 greedy, {workload}: {name} output tok/s over plain", "reported",
                                  _get(entry, method, "ratio"), detail=_acceptance(entry, method)))
    goals += _sibling_goals(_get(section, "sibling"))
    every_batch1 = _every_batch1(section)
    slowest, workload, method = _slowest(every_batch1)
    goals.append(Goal(11, "`spec` batch 1: slowest workload and proposer over plain (adaptive K)", ">= 0.9x",
                      slowest, lambda v: v >= 0.9, detail=_slowest_detail(every_batch1, workload, method)))
    mixed = _get(section, "mixed")
    requests = f" ({mixed['num_requests']} requests)" if mixed else ""
    goals.append(Goal(11, f"`spec` inside `mixed`{requests}: n-gram output tok/s over plain", "reported",
                      _get(mixed, "ngram", "ratio"), detail=_acceptance(mixed, "ngram")))
    if section is not None and section.get("batch_sweep"):
        goals.append(_crossover(section))
    return goals


def _sibling_goals(sibling: dict | None) -> list[Goal]:
    """Reported rows of the larger target: n-gram and its smaller sibling drafting, per workload."""
    if not sibling:
        return []
    pair = f"{Path(sibling['target']).name} with {Path(sibling['draft']).name}"
    return [Goal(11, f"`spec` batch 1 greedy, {workload}, {pair}: {name}, output tok/s over plain", "reported",
                 _get(entry, method, "ratio"), detail=_acceptance(entry, method))
            for workload, entry in sibling["batch1"].items()
            for method, name in (("ngram", "n-gram"), ("draft", "the smaller sibling as draft model"))]  # fmt: skip


def _every_batch1(section: dict | None) -> dict:
    """The batch-1 entries of the main target and, labelled with their target's name, the sibling pair's."""
    batch1 = dict(_get(section, "batch1") or {})
    sibling = _get(section, "sibling")
    if sibling:
        batch1.update({f"{workload} ({Path(sibling['target']).name})": entry for workload, entry in sibling["batch1"].items()})
    return batch1


def _crossover(section: dict) -> Goal:
    """The first swept batch at which n-gram no longer pays; the largest batch swept when it always paid."""
    swept = sorted(map(int, section["batch_sweep"]))
    crossover = section.get("crossover_batch")
    what = f"`spec` batch sweep ({', '.join(map(str, swept))}) on code-edit: first batch where n-gram stops paying"
    if crossover is None:
        return Goal(11, what, "reported", float(swept[-1]), unit="", detail="none: n-gram still pays at the largest batch swept")
    return Goal(11, what, "reported", float(crossover), unit="")


def _acceptance(entry: dict | None, method: str) -> str:
    data = (entry or {}).get(method)
    if not isinstance(data, dict) or "acceptance_rate" not in data:
        return ""
    text = acceptance_text(data)
    return text if text == NEVER_DRAFTED else f"acceptance {text}"


def _slowest(batch1: dict) -> tuple[float | None, str, str]:
    """The lowest proposer / plain ratio over every batch-1 workload, with its workload and method ('' when none)."""
    found = [(entry[m]["ratio"], workload, m) for workload, entry in batch1.items()
             for m in entry if isinstance(entry[m], dict) and entry[m].get("ratio") is not None]  # fmt: skip
    return min(found) if found else (None, "", "")


def _slowest_detail(batch1: dict, workload: str, method: str) -> str:
    """Which run was slowest and, where it drafted nothing or its repeats pair with plain's, each repeat's own ratio to
    the plain run of the same repeat: a ratio of medians moves with whichever repeats drew this machine's slow phases,
    a repeat's pair of runs shares its phase."""
    if not workload:
        return ""
    entry = batch1[workload]
    parts = [f"{workload}, {method}"]
    if acceptance_text(entry[method]) == NEVER_DRAFTED:
        parts.append(NEVER_DRAFTED)
    pairs = _paired_ratios(entry["plain"]["tok_s"]["values"], entry[method]["tok_s"]["values"])
    if len(pairs) > 1:
        parts.append(f"per-repeat ratios {', '.join(f'{r:.2f}' for r in pairs)}: median {statistics.median(pairs):.2f}x")
    return "; ".join(parts)


def _paired_ratios(plain: list[float], other: list[float]) -> list[float]:
    """Each repeat's `other` over the same repeat's `plain` (none unless both ran every repeat)."""
    if len(plain) != len(other) or any(value <= 0 for value in plain):
        return []
    return [b / a for a, b in zip(plain, other, strict=True)]


# -- issue 10: quantization -------------------------------------------------------------------------


def quant_row(section: dict | None, name: str) -> dict | None:
    """The quant table's row of a method ('rtn4', named 'rtn4 g128' there), 'float32' or 'checkpoint as stored'."""
    for row in _get(section, "rows") or []:
        if row["name"] == name or row["name"].split()[0] == name:
            return row
    return None


def method_rows(section: dict | None, bits: int) -> list[dict]:
    """The rows of the quantization methods at `bits` (not the float model, not the checkpoint as stored)."""
    from ember.bench.quant_methods import METHOD_SPECS

    return [r for r in _get(section, "rows") or [] if METHOD_SPECS.get(r["name"].split()[0], (None, None))[1] == bits]


def quant_goals(results: dict) -> list[Goal]:
    section = results.get("quant")
    goals = _quality_goals(section, "`quant`")
    for also in (section or {}).get("also", []):  # further models (bench all --quant-also): the same quality goals each
        goals += _quality_goals(also, f"`quant` on {Path(also['model']).name}")
    goals.append(_memory(section))
    goals.append(_batch1_vs_float(results))
    goals.append(Goal(10, "`batch1` 4-bit GGUF in its blocks (`--dtype auto`): ember / llama.cpp decode tok/s, same run", ">= 1x",
                      _get(results, "batch1", "dtype", "auto", "ratio_llamacpp"), lambda v: v >= 1.0))
    goals.append(Goal(10, "`mixed` 4-bit GGUF in its blocks (`--dtype auto`): ember / llama.cpp output tok/s, same run", ">= 1.5x",
                      _get(results, "mixed", "dtype", "auto", "ratio_llamacpp"), lambda v: v >= 1.5))
    return goals


def _quality_goals(section: dict | None, label: str) -> list[Goal]:
    """GPTQ and AWQ at or below RTN at 4 bits, and every method within the stated bound of the float model."""
    goals = [_ranking(section, "gptq4", label), _ranking(section, "awq4", label)]
    for bits, bound in PPL_BOUND_PCT.items():
        worst = _worst_over_float(section, bits)
        goals.append(Goal(10, f"{label} every {bits}-bit method: perplexity over float32 (worst)", f"<= +{bound:g}% (stated bound)",
                          worst[0], lambda v, bound=bound: v <= bound, unit="+%", detail=worst[1]))
    return goals


def _ranking(section: dict | None, method: str, label: str) -> Goal:
    row, rtn = quant_row(section, method), quant_row(section, "rtn4")
    value = row["perplexity"] / rtn["perplexity"] if row and rtn else None
    return Goal(10, f"{label} 4-bit g{_get(section, 'group_size') or 128} perplexity: {method[:-1].upper()} / RTN", "<= 1.00x",
                value, lambda v: v <= 1.0)


def _worst_over_float(section: dict | None, bits: int) -> tuple[float | None, str]:
    rows = method_rows(section, bits)
    if not rows:
        return None, ""
    worst = max(rows, key=lambda r: r["ppl_vs_float_pct"])
    return worst["ppl_vs_float_pct"], worst["name"]


def _memory(section: dict | None) -> Goal:
    """float32 bytes per parameter over the most compact 4-bit row's (the seed's memory claim)."""
    float_row = quant_row(section, "float32")
    four_bit = method_rows(section, 4)
    stored = quant_row(section, "checkpoint as stored")
    if stored and stored["bytes_per_parameter"] < 1.0:  # a 4-bit GGUF as shipped counts as 4-bit weights
        four_bit.append(stored)
    value, detail = None, ""
    if float_row and four_bit:
        compact = min(four_bit, key=lambda r: r["bytes_per_parameter"])
        value = float_row["bytes_per_parameter"] / compact["bytes_per_parameter"]
        detail = f"{compact['name']}: {compact['bytes_per_parameter']:.3f} bytes/param"
    return Goal(10, "`quant` memory: float32 bytes per parameter over 4-bit's", f">= {SEED_MEMORY_RATIO:g}x (the seed's claim)",
                value, lambda v: v >= SEED_MEMORY_RATIO, detail=detail)


def _batch1_vs_float(results: dict) -> Goal:
    """4-bit decode over ember's own float32: same-run `batch1` when it ran `--dtype auto`, else the quant table."""
    what = "batch-1 decode with 4-bit weights over ember's own float32"
    same_run = _get(results, "batch1", "ember_auto_vs_float32")
    if same_run is not None:
        return Goal(10, what, ">= 2.5x", same_run, lambda v: v >= 2.5, detail="`batch1`, dtype auto vs float32")
    stored, float_row = quant_row(results.get("quant"), "checkpoint as stored"), quant_row(results.get("quant"), "float32")
    four_bit = stored if stored and stored["bytes_per_parameter"] < 1.0 else quant_row(results.get("quant"), "rtn4")
    value = four_bit["decode_tok_s"] / float_row["decode_tok_s"] if four_bit and float_row and float_row["decode_tok_s"] else None
    detail = f"`quant` table, {four_bit['name']} vs float32" if value is not None else ""
    return Goal(10, what, ">= 2.5x", value, lambda v: v >= 2.5, detail=detail)


# -- issue 12: parallelism --------------------------------------------------------------------------


def parallel_goals(results: dict) -> list[Goal]:
    modes = _get(results, "parallel", "modes") or {}
    if not modes:
        return [Goal(12, "`parallel`: bytes per token per rank, counted / formula", "1.00x (within 1%)", None)]
    goals = []
    for mode, run in modes.items():
        goals += _parallel_mode_goals(mode, run, _get(results, "parallel", "torch_threads"))
    return goals


def _padding_note(run: dict) -> str:
    """A sequence split's formula is per padded token: say how many tokens the padding added."""
    if (padded := padding(run)) is None:
        return ""
    tokens, counted = padded
    return f" per padded token ({counted} padded for {tokens} computed: {counted / tokens:.2f}x)"


def _parallel_mode_goals(mode: str, run: dict, threads: int | None) -> list[Goal]:
    world = run["world_size"]
    counted, formula = run["bytes_per_token_counted"], run["bytes_per_token_formula"]
    traffic = counted / formula if formula else None
    share = max(run["rank_weight_bytes"]) * world / run["whole_weight_bytes"] if run["whole_weight_bytes"] else None
    name = f"`parallel` {PARALLEL_MODES.get(mode, mode)} x{world}"
    goals = [
        Goal(12, f"{name}: {run['collective']} bytes per token per rank, counted / formula", "1.00x (within 1%)",
             traffic, lambda v: abs(v - 1.0) <= 0.01, detail=f"{counted:,.0f} / {formula:,.0f} bytes{_padding_note(run)}"),
        Goal(12, f"{name}: largest rank's weight bytes over whole model / {world}", f"<= {RANK_SHARE_SLACK:.2f}x (~1/T each)",
             share, lambda v: v <= RANK_SHARE_SLACK),
        Goal(12, f"{name} over one process, measured here", "reported", run["speedup"],
             detail=f"torch threads per rank: {run.get('threads_per_rank', threads) or '?'}, one shared CPU box"),
        Goal(12, f"{name}: share of rank 0's run time inside collectives", "reported", 100.0 * run["communication_share"], unit="%"),
    ]
    if mode == "pipeline":
        goals.append(Goal(12, f"{name}: rank 0 idle waiting for later stages (bubble, no micro-batches)", "reported",
                          100.0 * run["rank0_idle_share"], unit="%"))
    if run.get("modelled_speedup_batch1") is not None:
        goals.append(Goal(12, f"{name}: modelled batch-1 decode speedup", "reported", run["modelled_speedup_batch1"],
                          detail=run["hardware_model"]["name"]))
    return goals
