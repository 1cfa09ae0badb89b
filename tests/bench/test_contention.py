"""`ember bench contention`'s section: medians per condition, ratios to quiet, and the 0.4x goal read from them."""

from __future__ import annotations

from ember.bench.contention import _section, format_contention_section


def test_ratios_are_medians_over_the_quiet_median_and_the_goal_reads_them() -> None:
    figures = {
        "quiet": {"batch1": [100.0, 120.0, 110.0], "mixed": [200.0, 200.0, 200.0]},
        "busy-loop": {"batch1": [50.0, 60.0, 55.0], "mixed": [60.0, 70.0, 80.0]},
        "ember-engine": {"batch1": [44.0, 44.0, 44.0], "mixed": [100.0, 100.0, 100.0]},
    }
    section = _section(figures, "m", "auto", 3)
    batch1 = section["workloads"]["batch1"]
    assert batch1["quiet"]["output_tok_s"]["median"] == 110.0
    assert batch1["busy-loop"]["ratio_to_quiet"] == 0.5
    assert batch1["ember-engine"]["ratio_to_quiet"] == 0.4
    assert section["workloads"]["mixed"]["busy-loop"]["ratio_to_quiet"] == 0.35
    text = format_contention_section(section)
    verdicts = [line.split()[-1] for line in text.splitlines()[2:] if "quiet" not in line.split()[1]]
    assert verdicts == ["met", "met", "MISSED", "met"]
