"""`ember serve` flags: given a command line, the server and engine configs say exactly that."""

from __future__ import annotations

import argparse

import pytest

from ember.engine.config import EngineConfig
from ember.server.cli import register, server_config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ember")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_serve_flags_build_the_server_config() -> None:
    args = parse(
        "--model", "smollm2-135m-instruct", "--host", "0.0.0.0", "--port", "9001",
        "--max-waiting", "7", "--max-body-bytes", "65536", "--served-model-name", "a", "b",
    )  # fmt: skip
    config = server_config_from_args(args)
    assert (config.host, config.port, config.max_waiting, config.max_body_bytes) == ("0.0.0.0", 9001, 7, 65536)
    assert config.served_model_names == ["a", "b"]
    assert not config.log_prompts and config.enable_debug_endpoints
    assert EngineConfig.from_args(args).model == "smollm2-135m-instruct"
    assert args.func.__name__ == "serve_command"


def test_engine_flags_are_accepted_by_serve() -> None:
    args = parse("--model", "m", "--max-model-len", "512", "--num-kv-blocks", "64", "--no-prefix-caching")
    engine_config = EngineConfig.from_args(args)
    assert engine_config.max_model_len == 512
    assert engine_config.cache.num_kv_blocks == 64 and not engine_config.cache.enable_prefix_caching


@pytest.mark.parametrize(
    "flags, message",
    [(["--max-waiting", "0"], "--max-waiting"), (["--port", "70000"], "port"), (["--max-body-bytes", "10"], "--max-body-bytes")],
)
def test_bad_server_flags_exit_with_a_message(flags: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        server_config_from_args(parse("--model", "m", *flags))
