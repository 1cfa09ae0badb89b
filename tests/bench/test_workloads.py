"""Workloads: deterministic from a seed, within their specified shapes, identical after a JSONL round trip."""

from __future__ import annotations

import pytest

from ember.bench import workloads
from ember.bench.workloads import TokenSource, Workload


@pytest.fixture
def source() -> TokenSource:
    return TokenSource(list(range(100, 5100)), bos_id=1, description="test ids")


@pytest.mark.parametrize("name", workloads.WORKLOAD_NAMES)
def test_same_seed_gives_the_same_requests(source, name):
    first = workloads.build(name, source, seed=3)
    second = workloads.build(name, source, seed=3)
    assert first.requests == second.requests


def test_another_seed_gives_other_requests(source):
    assert workloads.build("mixed", source, seed=1).requests != workloads.build("mixed", source, seed=2).requests


def test_mixed_lengths_stay_within_the_issue_bounds(source):
    workload = workloads.mixed(source, seed=0)
    assert len(workload.requests) == 64
    assert all(32 <= r.prompt_len <= 512 and 16 <= r.max_tokens <= 256 for r in workload.requests)
    assert all(r.prompt_token_ids[0] == 1 for r in workload.requests)  # BOS first
    lengths = sorted(r.prompt_len for r in workload.requests)
    assert lengths[len(lengths) // 2] < 300 < lengths[-1]  # skewed: median well below the long tail


def test_batch1_is_one_128_by_128_request(source):
    (request,) = workloads.batch1(source).requests
    assert (request.prompt_len, request.max_tokens) == (128, 128)


def test_shared_prefix_requests_share_exactly_the_system_prompt(source):
    workload = workloads.shared_prefix(source, num_requests=8, prefix_len=64, question_len=32)
    prefixes = {tuple(r.prompt_token_ids[:64]) for r in workload.requests}
    questions = {tuple(r.prompt_token_ids[64:]) for r in workload.requests}
    assert len(prefixes) == 1 and len(questions) == 8
    assert all(r.prompt_len == 96 for r in workload.requests)


def test_long_prefill_prompts_arrive_while_decoders_run(source):
    workload = workloads.long_prefill(source, num_decoders=4, num_long=2, long_prompt_len=256, decoder_output_len=30)
    decoders = [r for r in workload.requests if r.role == "decoder"]
    longs = [r for r in workload.requests if r.role == "long-prompt"]
    assert [r.after_tokens for r in decoders] == [0, 0, 0, 0]
    assert [r.after_tokens for r in longs] == [10, 20]
    assert all(r.prompt_len == 256 for r in longs)


def test_serve_arrivals_are_increasing_at_a_finite_rate(source):
    arrivals = [r.arrival_s for r in workloads.serve(source, num_requests=16, request_rate=4.0).requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and arrivals[-1] > 0


def test_jsonl_round_trip_keeps_every_field(source, tmp_path):
    workload = workloads.long_prefill(source, seed=5, num_decoders=3, num_long=1, long_prompt_len=128)
    path = tmp_path / "w.jsonl"
    workload.save(path)
    loaded = Workload.load(path)
    assert (loaded.name, loaded.seed, loaded.params, loaded.source) == (workload.name, 5, workload.params, "test ids")
    assert loaded.requests == workload.requests


def test_loading_a_file_that_is_not_a_workload_says_so(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="not an ember workload"):
        Workload.load(path)


def test_unknown_workload_name_lists_the_known_ones(source):
    with pytest.raises(ValueError, match="mixed"):
        workloads.build("nope", source)


def test_builtin_sample_is_used_without_the_corpus(monkeypatch):
    monkeypatch.setattr(workloads, "find_corpus_dir", lambda: None)
    text, where = workloads.corpus_text()
    assert "built-in" in where and "universally acknowledged" in text
