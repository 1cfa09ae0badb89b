"""`ember bench seed`: run the experiments behind the seed's claims, judge each claim, write SEED_CLAIMS.md and its JSON.

A run measures the experiments of the claims asked for (all by default) and merges them into the JSON
already beside the report, so one row can be re-measured alone (`--only kv-waste`) and the others kept.
Rows are rebuilt from the experiments' figures on every write: the verdict always follows from the figure.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

from ember.bench.machine import git_commit, load_average, machine_info
from ember.bench.seed_claims import CLAIMS, CLAIMS_BY_ID, VERDICTS, Claim

JSON_NAME = "seed_claims.json"


def run_seed(claim_ids: tuple[str, ...], context, report_path: Path, command: str, flags: str = "") -> dict:
    """Measure the experiments of `claim_ids` with `context` (a SeedContext), merge into the JSON beside
    `report_path`, rewrite both files; returns the merged results. `flags`: the options of this run that a row's
    own command must repeat to measure it the same way (e.g. ' --scale 0.25')."""
    experiments = tuple(dict.fromkeys(CLAIMS_BY_ID[claim].experiment for claim in claim_ids))
    run = {"command": command, "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "pid": os.getpid(),
           "commit": git_commit(), "experiments": []}
    measured: dict = {}
    machine = machine_info()
    results: dict = {}
    for name in experiments:
        context.tick(f"seed: experiment {name}")
        measured[name] = _measure(name, context, command, flags)
        run["experiments"].append(name)
        run["load_average_at_end"] = load_average()
        # After each experiment, merged into the file as it is now: a run cut short keeps what it measured, and
        # runs of other rows at the same time keep theirs.
        results = _merge_and_write(report_path, measured, run, machine)
    return results


def _measure(name: str, context, command: str, flags: str) -> dict:
    """One experiment's outcome, stamped with the command and options that measured it; a failure becomes its rows' reason."""
    from ember.bench.seed_experiments import EXPERIMENT_RUNNERS

    begun = time.monotonic()
    try:
        outcome = EXPERIMENT_RUNNERS[name](context)
    except Exception as error:  # noqa: BLE001 - one broken experiment must not lose the others' rows
        traceback.print_exc()
        reason = f"the experiment failed: {type(error).__name__}: {error}"[:400]
        outcome = {"plots": [], "figures": {c.id: {"value": None, "detail": "", "modelled": False, "reason": reason}
                                            for c in CLAIMS if c.experiment == name}}
    outcome.update(command=command, flags=flags, measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   seconds=round(time.monotonic() - begun, 1), scale=context.scale, repeats=context.repeats)
    return outcome


def _merge_and_write(report_path: Path, measured: dict, run: dict, machine: dict) -> dict:
    """The JSON beside `report_path` with this run's experiments and run record put in, rows rebuilt; both files rewritten."""
    json_path = report_path.with_name(JSON_NAME)
    results = json.loads(json_path.read_text()) if json_path.is_file() else {"experiments": {}, "runs": []}
    results["experiments"].update(measured)
    others = [r for r in results["runs"] if (r.get("started_at"), r.get("pid")) != (run["started_at"], run["pid"])]
    results["runs"] = [*others, run]
    results["machine"] = machine
    results["rows"] = build_rows(results["experiments"])
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    report_path.write_text(render_markdown(results, report_path.resolve().parent))
    return results


def build_rows(experiments: dict) -> list[dict]:
    """One row per claim, in the seed's order: the claim, its figure, and the verdict computed from the figure."""
    rows = []
    for claim in CLAIMS:
        experiment = experiments.get(claim.experiment)
        measured = (experiment or {}).get("figures", {}).get(claim.id)
        if measured is None:
            measured = {"value": None, "detail": "", "modelled": False,
                        "reason": f"not run yet: `{reproduce_command(claim, '')}`"}
        rows.append({"id": claim.id, "quote": claim.quote, "place": claim.place, "claimed": claim.claimed(), "unit": claim.unit,
                     "figure": measured["value"], "modelled": measured["modelled"], "detail": measured["detail"],
                     "reason": measured["reason"], "verdict": claim.verdict(measured["value"]), "known_error": claim.known_error,
                     "command": reproduce_command(claim, (experiment or {}).get("flags", "")), "plots": (experiment or {}).get("plots", []),
                     "measured_at": (experiment or {}).get("measured_at")})
    return rows


def reproduce_command(claim: Claim, flags: str) -> str:
    """The command that re-measures `claim`'s row alone, as its last run measured it."""
    return f"ember bench seed --only {claim.id}{flags}"


def render_markdown(results: dict, report_dir: Path) -> str:
    """SEED_CLAIMS.md: a summary table, then per claim what was measured, how, and why the verdict."""
    rows = results["rows"]
    machine = results.get("machine", {})
    counts = {verdict: sum(row["verdict"] == verdict for row in rows) for verdict in VERDICTS}
    runs = results.get("runs", [])
    latest = runs[-1] if runs else {}
    loads = [run.get("load_average_at_end") for run in runs if run.get("load_average_at_end")]
    lines = [
        "# The seed's claims, checked on this machine",
        "",
        "Generated by `ember bench seed` (do not edit by hand: re-run the command, or one row with the command in its section).",
        f"Machine: {machine.get('cpu_model', 'unknown')}, {machine.get('logical_cpus')} logical CPUs, {machine.get('memory_gib')} GiB, "
        f"torch {machine.get('torch')}. {len(runs)} run(s) measured these rows, the latest `{latest.get('command')}` at "
        f"{latest.get('started_at')} on commit {latest.get('commit')}; each section says when its figure was measured.",
        f"Figures are noisy: this machine's {machine.get('logical_cpus')} cores were shared with other work while it measured (1-minute "
        f"load average {min(load[0] for load in loads) if loads else '?'}-{max(load[0] for load in loads) if loads else '?'} at the end of "
        "each experiment); every ratio compares runs of one experiment, interleaved. "
        "Claims about GPUs are measured on a GPU where torch sees one; a figure marked (modelled) comes from figures measured "
        "here and an H100 SXM's published bandwidth and FLOPs. The seed's chapter is quoted as issue 53 lists its claims "
        "(the chapter's text is not among the shared assets of this checkout).",
        "",
        "Verdicts: " + ", ".join(f"{count} {verdict}" for verdict, count in counts.items() if count) + ".",
        "",
        "| claim (seed) | claimed | here | verdict |",
        "|---|---|---|---|",
    ]
    for row in rows:
        here = "-" if row["figure"] is None else f"{row['figure']:.3g} {row['unit']}" + (" (modelled)" if row["modelled"] else "")
        flag = " **seed error**" if row["known_error"] else ""
        lines.append(f"| [{row['quote']}](#{row['id']}) | {row['claimed']} | {here} | {row['verdict']}{flag} |")
    lines.append("")
    for row in rows:
        lines += _row_section(row, report_dir)
    return "\n".join(lines) + "\n"


def _row_section(row: dict, report_dir: Path) -> list[str]:
    lines = [f"## {row['id']}", "", f"> {row['quote']}", "", f"Where: {row['place']}.", ""]
    figure = "not measured" if row["figure"] is None else f"**{row['figure']:.4g} {row['unit']}**" + (" (modelled)" if row["modelled"] else "")
    lines.append(f"Claimed {row['claimed']}; here {figure}: **{row['verdict']}**.")
    if row["detail"]:
        lines.append(f"Measured: {row['detail']}.")
    if row["reason"]:
        lines.append(f"{'Modelled on' if row['modelled'] else 'Why'}: {row['reason']}.")
    if row["known_error"]:
        lines.append(f"Seed error: {row['known_error']}.")
    lines.append(f"Reproduce: `{row['command']}`" + (f" (measured {row['measured_at']})" if row["measured_at"] else "") + ".")
    for plot in row["plots"]:
        lines.append(f"![{row['id']}]({_relative(Path(plot), report_dir)})")
    lines.append("")
    return lines


def _relative(path: Path, report_dir: Path) -> str:
    try:
        return path.resolve().relative_to(report_dir.resolve()).as_posix()
    except ValueError:
        return path.as_posix()
