"""`ember bench` is registered with every sub-subcommand of issue 5."""

from __future__ import annotations

import pytest

from ember.cli.main import build_parser


@pytest.mark.parametrize("command", ["mixed", "batch1", "shared-prefix", "long-prefill", "serve", "roofline", "all", "tokenizers", "gateway", "spec", "contention", "seed"])
def test_every_bench_subcommand_parses(command):
    args = build_parser().parse_args(["bench", command])
    assert args.bench_command == command and callable(args.func)


def test_mixed_takes_peers_and_a_request_count():
    args = build_parser().parse_args(["bench", "mixed", "--model", "m", "--peers", "hf", "--num-requests", "8"])
    assert (args.model, args.peers, args.num_requests) == ("m", "hf", 8)


def test_an_unknown_peer_is_refused_with_the_known_ones():
    from ember.bench.cli import _options

    args = build_parser().parse_args(["bench", "mixed", "--peers", "sglang"])
    with pytest.raises(ValueError, match="hf, llamacpp, vllm"):
        _options(args)


def test_per_workload_request_counts_parse_and_bad_ones_say_what_to_write():
    from ember.bench.cli import _parse_requests

    assert _parse_requests("mixed=20, serve=8") == {"mixed": 20, "serve": 8}
    assert _parse_requests(None) == {}
    with pytest.raises(ValueError, match="NAME=N"):
        _parse_requests("batch1=3")


def test_request_counts_override_the_scale_per_workload():
    from ember.bench.suite import BenchOptions

    options = BenchOptions(scale=0.25, requests_by_workload={"mixed": 20})
    assert options.requests(64, "mixed") == 20
    assert options.requests(64, "serve") == 16


def test_the_static_lever_at_one_dtype_plans_fewer_runs():
    from ember.bench.suite import BenchOptions, planned_runs

    both = BenchOptions(dtypes=("float32", "bfloat16"), repeats=3, peers=("hf",))
    one = BenchOptions(dtypes=("float32", "bfloat16"), repeats=3, peers=("hf",), static_dtypes=("float32",))
    assert planned_runs(both, "mixed") == (2 * 2 + 2) * 3
    assert planned_runs(one, "mixed") == (2 * 2 + 1) * 3


def test_serve_takes_length_caps_and_refuses_a_single_output_token():
    from ember.bench.suite import BenchOptions, bench_serve

    args = build_parser().parse_args(["bench", "serve", "--max-prompt-tokens", "64", "--max-output-tokens", "32"])
    assert (args.max_prompt_tokens, args.max_output_tokens) == (64, 32)
    with pytest.raises(ValueError, match="--max-output-tokens at least 2"):
        bench_serve(BenchOptions(), max_output=1)


def test_bench_all_refuses_a_bad_sibling_pair_or_an_unpulled_model_before_running(tmp_path, monkeypatch, capsys):
    from ember.cli.main import main

    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    assert main(["bench", "all", "--only", "spec", "--spec-sibling", "only-one-model", "--out-dir", str(tmp_path)]) == 2
    assert "TARGET,DRAFT" in capsys.readouterr().err
    assert main(["bench", "all", "--only", "quant", "--quant-also", "qwen2.5-coder-0.5b-instruct", "--out-dir", str(tmp_path)]) == 2
    assert "run `ember pull qwen2.5-coder-0.5b-instruct`" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()  # nothing ran


def test_bench_threads_are_set_for_the_run_and_zero_is_refused():
    import torch

    from ember.bench.cli import _options

    before = torch.get_num_threads()
    try:
        _options(build_parser().parse_args(["bench", "batch1", "--threads", "1", "--peers", "none"]))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="--threads"):
        _options(build_parser().parse_args(["bench", "batch1", "--threads", "0", "--peers", "none"]))


@pytest.mark.parametrize("extra", [["--peers", "hf"], ["--peers", "vllm", "--url", "http://127.0.0.1:9"],
                                   ["--peers", "vllm", "--data-parallel-size", "2"]])
def test_serve_takes_vllm_as_its_only_peer_beside_its_own_server(extra):
    from ember.bench.cli import _run_workload

    args = build_parser().parse_args(["bench", "serve", "--threads", "1", *extra])
    with pytest.raises(ValueError, match="takes vllm only"):
        _run_workload(args)
