"""Fixtures of the server tests: a real `serve` process on the SmolLM2 GGUF."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import ServeProcess, smollm2_server_process


@pytest.fixture(scope="module")
def smollm2_server(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One real server per test module, stopped (and checked to stop) at the module's end."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    server = smollm2_server_process(smollm2_gguf, log_path)
    with server:
        yield server
    assert server.returncode is not None, "the server did not stop when terminated"
