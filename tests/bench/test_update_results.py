"""`ember bench all --update-results`: some sections re-measured, the rest kept, and the report says which run made which."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ember.bench import report
from ember.bench.run_all import merge_update

SAVED = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture
def base() -> dict:
    saved = sorted(p for p in SAVED.glob("2*.json"))
    if not saved:
        pytest.skip(f"no saved results under {SAVED}")
    return json.loads(saved[-1].read_text())


def _update(base: dict) -> dict:
    soak = copy.deepcopy(base["soak"])
    soak["num_requests"] = 10_000
    return {"command": "ember bench all --only soak,spec --update-results OLD.json", "commit": "abc1234",
            "started_at": "2026-12-01 13:00 UTC", "finished_at": "2026-12-01 13:30 UTC",
            "machine": {"load_average_during": {"mean": 2.5, "max": 3.1, "samples": 9}},
            "soak": soak, "errors": {"spec": "RuntimeError: broken"}, "skipped": {}}


def test_only_the_named_sections_change_and_the_update_is_recorded(base):
    merged = merge_update(base, _update(base), ("soak", "spec"))
    assert merged["soak"]["num_requests"] == 10_000
    assert "spec" not in merged  # re-measured and failed: the old figures must not pass for new ones
    assert merged["errors"] == {"spec": "RuntimeError: broken"}
    for key in ("mixed", "batch1", "quant", "command", "commit", "started_at"):
        assert merged[key] == base[key]
    assert merged["updates"][-1]["sections"] == ["soak", "spec"] and merged["updates"][-1]["commit"] == "abc1234"


def test_the_report_names_the_command_behind_re_measured_sections(base):
    text = report.render_markdown(merge_update(base, _update(base), ("soak", "spec")))
    header = text[: text.index("## ")]
    assert base["command"] in header
    assert "- `soak`, `spec`: 2026-12-01 13:00 UTC – 2026-12-01 13:30 UTC on commit `abc1234` (clean tree), load average 2.5" in header
    assert "`ember bench all --only soak,spec --update-results OLD.json`" in header
    assert "10000 mixed requests" in text


def test_an_update_on_another_cpu_says_so(base):
    update = _update(base)
    update["machine"] |= {"cpu_model": "Other CPU", "cpu_flags": ["avx2", "avx512_bf16"]}
    text = report.render_markdown(merge_update(base, update, ("soak", "spec")))
    line = next(line for line in text.splitlines() if line.startswith("- `soak`, `spec`"))
    assert "**on another CPU than the Machine table's** (Other CPU; SIMD flags avx2, avx512_bf16" in line
    update["machine"] |= {"cpu_model": base["machine"]["cpu_model"], "cpu_flags": base["machine"]["cpu_flags"]}
    same = report.render_markdown(merge_update(base, update, ("soak", "spec")))
    assert "another CPU" not in next(line for line in same.splitlines() if line.startswith("- `soak`, `spec`"))
