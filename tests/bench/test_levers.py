"""The levers of `mixed` measure something: static batches run another schedule than continuous
batching (or the row goes), and ember's engines share one load of the weights. Tiny random model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.bench.ember_runner import EmberSettings, make_engine, run_ember
from ember.bench.suite import _drop_static_if_same_schedule, static_batch_size
from ember.bench.workloads import BenchRequest, Workload
from tests.model_factory import save_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(save_tiny_model("llama", tmp_path_factory.mktemp("llama")))


def tiny_workload(num_requests: int) -> Workload:
    generator = torch.Generator().manual_seed(0)
    requests = [
        BenchRequest(f"mixed-{i}", torch.randint(0, 320, (5 + 3 * i,), generator=generator).tolist(), 4 + 2 * i)
        for i in range(num_requests)
    ]
    return Workload("mixed", 0, requests, {})


def test_static_batches_always_split_the_requests_into_two_or_more():
    assert [static_batch_size(n) for n in (1, 2, 3, 12, 32, 64)] == [None, 1, 2, 6, 16, 16]


def test_static_batches_run_more_steps_than_continuous_batching_on_the_same_requests(tiny_model):
    workload = tiny_workload(4)
    continuous = run_ember(tiny_model, "float32", workload, EmberSettings())
    static = run_ember(tiny_model, "float32", workload, EmberSettings(static_batch_size=static_batch_size(4)))
    assert continuous.output_tokens == static.output_tokens == sum(r.max_tokens for r in workload.requests)
    # Continuous: as long as the longest request (10 tokens) plus the warm-up; static: each batch as long as its longest.
    assert static.extra["num_steps"] > continuous.extra["num_steps"]


def test_a_static_row_with_the_continuous_schedule_is_dropped_with_the_reason():
    entry = {"ember": {"num_steps": [263, 263]}, "ember_static": {"num_steps": [263, 263]}}
    _drop_static_if_same_schedule(entry)
    assert "ember_static" not in entry and "same 263 engine steps" in entry["static_dropped"]
    kept = {"ember": {"num_steps": [263]}, "ember_static": {"num_steps": [300]}}
    _drop_static_if_same_schedule(kept)
    assert "ember_static" in kept and "static_dropped" not in kept


def test_every_engine_of_a_bench_process_shares_one_load_of_the_weights(tiny_model):
    first = make_engine(tiny_model, "float32", EmberSettings())
    second = make_engine(tiny_model, "float32", EmberSettings(enable_prefix_caching=False))
    assert first.runner.model is second.runner.model
    assert first.kv is not second.kv  # but each has its own cache


def test_served_against_offline_is_the_ratio_of_medians_of_the_same_measures():
    from ember.bench.results import RequestTiming, RunResult
    from ember.bench.suite import served_vs_offline

    def run(wall_s: float, tokens: int, tpot_s: float) -> RunResult:
        timing = RequestTiming("r", "main", 8, tokens, 0.0, first_token=1.0, finished=1.0 + tpot_s * (tokens - 1))
        return RunResult("x", "serve", wall_s, tokens, [timing], {"settings": {"max_num_seqs": 16}})

    compared = served_vs_offline([run(10.0, 400, 0.05)], [run(8.0, 400, 0.04)], [run(1.0, 11, 0.066)], [run(1.0, 11, 0.060)])
    assert compared["tok_s_ratio"] == pytest.approx(40.0 / 50.0)
    assert compared["batch1_tpot_ratio"] == pytest.approx(1.1)
    assert compared["batch1_tpot_ms"]["served"]["median"] == pytest.approx(66.0)
    assert compared["offline_settings"] == {"max_num_seqs": 16}


def test_batch1_roofline_percent_pairs_each_run_with_the_bandwidth_probed_around_it(tiny_model):
    from ember.bench.results import RequestTiming, RunResult
    from ember.bench.roofline import decode_bytes
    from ember.bench.suite import _batch1_entry, batch1_mean_context

    workload = tiny_workload(1)
    path = Path(tiny_model)
    per_token = decode_bytes(path, "float32", batch1_mean_context(workload)).total

    def run(tok_s: float) -> RunResult:
        timing = RequestTiming("r", "main", 128, 11, 0.0, first_token=1.0, finished=1.0 + 10 / tok_s)
        return RunResult("ember", "batch1", 2.0, 11, [timing], {"settings": {}})

    # Each run against the mean of the two probes around it: 50%, 100% and 60% of its own roofline.
    probes = [(55.0, 65.0), (28.0, 32.0), (40.0, 40.0)]
    rates = [fraction * (a + b) / 2 * 1e9 / per_token for fraction, (a, b) in zip((0.5, 1.0, 0.6), probes, strict=True)]
    entry = _batch1_entry({"ember": [run(r) for r in rates]}, probes, path, "float32", workload)
    assert entry["roofline_pct_runs"] == pytest.approx([50.0, 100.0, 60.0], rel=1e-3)
    assert entry["roofline_pct"] == pytest.approx(60.0, rel=1e-3)
    assert entry["roofline_tok_s"] == pytest.approx(40.0e9 / per_token)  # the median of the probes' means
    # Unpaired (median rate over median roofline) the same runs would read 75%: the pairing is what the figure measures.
    assert 100 * entry["ember"]["decode_tok_s"]["median"] / entry["roofline_tok_s"] == pytest.approx(75.0, rel=1e-3)
