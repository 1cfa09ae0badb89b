"""Fixtures of the server tests: a real `serve` process on the SmolLM2 GGUF or a tiny model, or the real engine
over the tiny model in this process (tests/server/real_engine.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import ServeProcess, smollm2_server_process, tiny_server_process
from tests.server.real_engine import RecordingEngine, tiny_engine


@pytest.fixture(scope="module")
def smollm2_server(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One real server per test module, stopped (and checked to stop) at the module's end."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    server = smollm2_server_process(smollm2_gguf, log_path)
    with server:
        yield server
    assert server.returncode is not None, "the server did not stop when terminated"


TINY_KV_BLOCKS = 40  # x 16 tokens: a few concurrent requests fill it, so load forces preemption
TINY_SERVED_CONTEXT = 256  # bounds how long any one request can generate


@pytest.fixture(scope="session")
def tiny_server(
    tiny_model_dir: Path, smollm2_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """One real `ember serve` of the tiny model for the session, with a KV pool small enough to preempt."""
    log_path = tmp_path_factory.mktemp("tiny-serve") / "serve.log"
    settings = ("--num-kv-blocks", str(TINY_KV_BLOCKS), "--block-size", "16", "--max-model-len", str(TINY_SERVED_CONTEXT))
    process = tiny_server_process(tiny_model_dir, smollm2_tokenizer_dir, log_path, *settings)
    with process:
        yield process
    assert process.returncode is not None, "the server did not stop when terminated"


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, smollm2_tokenizer_dir: Path) -> Iterator[RecordingEngine]:
    """The real engine over the tiny model for one test module (256 tokens of context), recording what reaches it."""
    recording = RecordingEngine(tiny_engine(tiny_model_dir, smollm2_tokenizer_dir))
    yield recording
    recording.shutdown()
