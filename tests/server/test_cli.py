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


def test_the_prefix_cache_flag_picks_the_radix_tree_or_block_hashes() -> None:
    assert EngineConfig.from_args(parse("--model", "m", "--prefix-cache", "radix")).cache.prefix_cache == "radix"
    assert EngineConfig.from_args(parse("--model", "m", "--prefix-cache", "hash")).cache.prefix_cache == "hash"
    with pytest.raises(SystemExit):
        parse("--model", "m", "--prefix-cache", "trie")


@pytest.mark.parametrize(
    "flags, message",
    [(["--max-waiting", "0"], "--max-waiting"), (["--port", "70000"], "port"), (["--max-body-bytes", "10"], "--max-body-bytes")],
)
def test_bad_server_flags_exit_with_a_message(flags: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        server_config_from_args(parse("--model", "m", *flags))


def test_vllm_spellings_of_engine_and_server_flags_are_accepted() -> None:
    args = parse("--model", "m", "--dtype", "half", "--no-enable-prefix-caching", "--enable-chunked-prefill",
                 "--trust-remote-code", "--api-key", "sk-1", "--speculative-config",
                 '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}')  # fmt: skip
    engine_config = EngineConfig.from_args(args)
    assert engine_config.dtype == "float16" and not engine_config.cache.enable_prefix_caching
    assert engine_config.scheduler.enable_chunked_prefill
    speculative = engine_config.speculative
    assert (speculative.method, speculative.num_speculative_tokens, speculative.ngram_max) == ("ngram", 5, 3)
    assert server_config_from_args(args).api_keys == ("sk-1",)
    draft = EngineConfig.from_args(parse("--model", "m", "--speculative-config", '{"model": "small.gguf", "num_speculative_tokens": 3}'))
    assert (draft.speculative.method, draft.speculative.draft_model) == ("draft", "small.gguf")


@pytest.mark.parametrize(
    "config, message",
    [("not json", "is not JSON"), ('{"method": "mlp_speculator"}', "'mlp_speculator' is not one ember runs"),
     ('{"method": "ngram", "disable_by_batch_size": 4}', "'disable_by_batch_size' has no counterpart")],
)  # fmt: skip
def test_a_speculative_config_ember_cannot_follow_is_refused_by_name(config: str, message: str, capsys) -> None:
    with pytest.raises(SystemExit):
        parse("--model", "m", "--speculative-config", config)
    assert message in capsys.readouterr().err


def test_speculative_config_and_the_speculation_flags_are_not_mixed() -> None:
    args = parse("--model", "m", "--speculative-method", "ngram", "--speculative-config", '{"method": "ngram"}')
    with pytest.raises(ValueError, match="drop --speculative-method"):
        EngineConfig.from_args(args)


def test_the_model_may_come_first_unflagged_as_vllm_serve_takes_it() -> None:
    assert EngineConfig.from_args(parse("smollm2-135m-instruct", "--port", "9002")).model == "smollm2-135m-instruct"
    assert EngineConfig.from_args(parse("a.gguf", "--model", "a.gguf")).model == "a.gguf"
    with pytest.raises(ValueError, match="two models given"):
        EngineConfig.from_args(parse("a.gguf", "--model", "b.gguf"))
    with pytest.raises(ValueError, match="give the model to load"):
        EngineConfig.from_args(parse("--port", "9002"))


def test_a_vllm_serve_command_line_runs_and_says_which_flags_change_nothing(caplog) -> None:
    from ember.server.cli import vllm_notes
    from ember.server.common.request_log import RequestLogger

    args = parse("Qwen/Qwen2.5-0.5B-Instruct", "--gpu-memory-utilization", "0.9", "--swap-space", "4", "--enforce-eager",
                 "--disable-log-stats", "--disable-log-requests", "--uvicorn-log-level", "warning", "-q", "fp8",
                 "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    config = server_config_from_args(args)
    assert not config.log_requests and config.uvicorn_log_level == "warning"
    assert EngineConfig.from_args(args).quantization == "fp8"
    notes = vllm_notes(args)
    assert len(notes) == 2 and "--kv-cache-memory" in notes[0] and "recomputes" in notes[1]
    assert vllm_notes(parse("--model", "m")) == []
    from ember.server.common.metrics import FinishedRequest

    finished = FinishedRequest("r", 3, 4, 0, "stop", 0.1, 0.01, 0.2)
    with caplog.at_level("INFO", logger="ember.server.requests"):
        RequestLogger(enabled=False).log_finished(finished)
        assert caplog.records == []
        RequestLogger().log_finished(finished)
        assert "request_id=r" in caplog.records[0].getMessage()


def test_a_tool_call_format_ember_does_not_read_is_refused_by_argparse(capsys) -> None:
    with pytest.raises(SystemExit):
        parse("--model", "m", "--tool-call-parser", "pythonic")
    assert "invalid choice: 'pythonic'" in capsys.readouterr().err
