"""`ember bench` is registered with every sub-subcommand of issue 5."""

from __future__ import annotations

import pytest

from ember.cli.main import build_parser


@pytest.mark.parametrize("command", ["mixed", "batch1", "shared-prefix", "long-prefill", "serve", "roofline", "all", "tokenizers"])
def test_every_bench_subcommand_parses(command):
    args = build_parser().parse_args(["bench", command])
    assert args.bench_command == command and callable(args.func)


def test_mixed_takes_peers_and_a_request_count():
    args = build_parser().parse_args(["bench", "mixed", "--model", "m", "--peers", "hf", "--num-requests", "8"])
    assert (args.model, args.peers, args.num_requests) == ("m", "hf", 8)


def test_an_unknown_peer_is_refused_with_the_known_ones():
    from ember.bench.cli import _options

    args = build_parser().parse_args(["bench", "mixed", "--peers", "vllm"])
    with pytest.raises(ValueError, match="hf, llamacpp"):
        _options(args)
