"""Percentiles, repeat spreads and ratios, checked against hand-computed values."""

from __future__ import annotations

import pytest

from ember.bench.results import RequestTiming, RunResult
from ember.bench.stats import latency_summary, percentile, ratio, spread


def test_percentile_interpolates_between_ranks_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 100) == 4.0


def test_percentile_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        percentile([], 50)


def test_spread_is_median_min_max_of_the_repeats():
    s = spread([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max, s.values) == (2.0, 1.0, 3.0, (3.0, 1.0, 2.0))


def test_ratio_is_none_when_a_side_is_missing_or_zero():
    assert ratio(10.0, 4.0) == 2.5
    assert ratio(None, 4.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def test_latency_summary_reports_milliseconds():
    summary = latency_summary([0.1, 0.2, 0.3])
    assert summary["count"] == 3
    assert summary["p50_ms"] == pytest.approx(200.0)
    assert summary["max_ms"] == pytest.approx(300.0)


def test_request_timing_gives_ttft_itl_and_tpot():
    timing = RequestTiming("r", "main", 10, 4, arrival=1.0, first_token=1.5, finished=2.4, token_times=[1.5, 1.8, 2.0, 2.4])
    assert timing.ttft_s == pytest.approx(0.5)
    assert timing.inter_token_s == pytest.approx([0.3, 0.2, 0.4])
    assert timing.tpot_s == pytest.approx(0.3)


def test_run_result_throughput_and_per_role_latencies():
    a = RequestTiming("a", "decoder", 5, 2, 0.0, 1.0, 2.0, [1.0, 2.0])
    b = RequestTiming("b", "long-prompt", 50, 1, 0.5, 3.0, 3.0, [3.0])
    run = RunResult("ember", "long-prefill", wall_s=3.0, output_tokens=3, requests=[a, b])
    assert run.output_tok_s == 1.0
    assert run.itls("decoder") == [1.0]
    assert run.ttfts("long-prompt") == [2.5]
    assert set(run.summary()["itl"]) == {"decoder", "long-prompt"}
