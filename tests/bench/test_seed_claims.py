"""`ember bench seed`: each claim's verdict follows from its figure, and the command writes a report and JSON whose rows
can be re-measured one at a time."""

from __future__ import annotations

import json

import pytest

from ember.bench.seed_claims import (
    CLAIMS,
    CLAIMS_BY_ID,
    DOES_NOT_HOLD,
    HOLDS,
    HOLDS_DIFFERENT_SIZE,
    NOT_MEASURABLE,
    Claim,
)
from ember.cli.main import build_parser

SPEEDUP = Claim("s", "x is 2-4x faster", "seed", "e", "x", 2, 4)
SAVING = Claim("p", "saves 50-90%", "seed", "e", "%", 50, 90, no_effect=0)
FACT = Claim("f", "takes 3.3 GB", "seed", "e", "GB", 3.3, 3.3, no_effect=0, is_exact=True)


@pytest.mark.parametrize(("claim", "figure", "verdict"), [
    (SPEEDUP, 3.0, HOLDS), (SPEEDUP, 4.3, HOLDS), (SPEEDUP, 1.5, HOLDS_DIFFERENT_SIZE), (SPEEDUP, 9.0, HOLDS_DIFFERENT_SIZE),
    (SPEEDUP, 1.0, DOES_NOT_HOLD), (SPEEDUP, 0.6, DOES_NOT_HOLD), (SPEEDUP, None, NOT_MEASURABLE),
    (SAVING, 70.0, HOLDS), (SAVING, 20.0, HOLDS_DIFFERENT_SIZE), (SAVING, -5.0, DOES_NOT_HOLD),
    (FACT, 3.4, HOLDS), (FACT, 2.15, DOES_NOT_HOLD),
])
def test_a_verdict_follows_from_the_figure_and_the_claimed_range(claim, figure, verdict):
    assert claim.verdict(figure) == verdict


def test_every_claim_names_an_experiment_the_command_can_run():
    from ember.bench.seed_experiments import EXPERIMENT_RUNNERS

    assert {claim.experiment for claim in CLAIMS} <= set(EXPERIMENT_RUNNERS)
    assert len(CLAIMS_BY_ID) == len(CLAIMS)


def _seed(tmp_path, only: str) -> int:
    args = build_parser().parse_args(["bench", "seed", "--only", only, "--scale", "0.1", "--repeats", "1",
                                      "--report", str(tmp_path / "SEED_CLAIMS.md"), "--plots-dir", str(tmp_path / "plots")])
    return args.func(args)


def test_the_command_writes_every_row_and_re_measures_one_alone(tmp_path):
    assert _seed(tmp_path, "kv-waste,kv-llama2-7b") == 0
    results = json.loads((tmp_path / "seed_claims.json").read_text())
    rows = {row["id"]: row for row in results["rows"]}
    assert list(rows) == [claim.id for claim in CLAIMS]
    assert rows["kv-waste"]["figure"] == pytest.approx(100 * (1 - 50 / 2048), abs=1e-3)
    assert rows["kv-llama2-7b"]["figure"] == pytest.approx(2.147, abs=1e-3)
    assert (rows["kv-waste"]["verdict"], rows["kv-llama2-7b"]["verdict"]) == (HOLDS, DOES_NOT_HOLD)
    assert rows["kv-llama2-7b"]["known_error"] and rows["kv-waste"]["command"] == "ember bench seed --only kv-waste --scale 0.1 --repeats 1"
    assert rows["tp-allreduce"]["verdict"] == NOT_MEASURABLE and "not run yet" in rows["tp-allreduce"]["reason"]
    assert all((tmp_path / "plots" / "seed_kv_waste.png").stat().st_size > 0 for _ in rows["kv-waste"]["plots"])
    report = (tmp_path / "SEED_CLAIMS.md").read_text()
    assert all(claim.quote in report for claim in CLAIMS)
    assert "`ember bench seed --only kv-llama2-7b --scale 0.1 --repeats 1`" in report and "**seed error**" in report

    # A stored figure moved: the next write judges it anew (the verdict is computed, not kept).
    results["experiments"]["kv-waste"]["figures"]["kv-waste"]["value"] = 60.0
    (tmp_path / "seed_claims.json").write_text(json.dumps(results))
    assert _seed(tmp_path, "kv-llama2-7b") == 0
    rows = {row["id"]: row for row in json.loads((tmp_path / "seed_claims.json").read_text())["rows"]}
    assert rows["kv-waste"]["verdict"] == DOES_NOT_HOLD and rows["kv-waste"]["figure"] == 60.0
    assert rows["kv-llama2-7b"]["verdict"] == DOES_NOT_HOLD


def test_an_unknown_claim_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="kv-waste"):
        _seed(tmp_path, "kv-wasted")
