"""Fixtures shared by the whole suite: where the read-only shared assets lie.

A missing asset fails the test that needs it (see tests/shared_assets.py); set
EMBER_SHARED_OPTIONAL=1 to skip those tests instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared_assets import SHARED_ENV, missing_shared_asset, shared_dir_candidate, shared_file


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared assets folder (models, tokenizers, corpus)."""
    path = shared_dir_candidate()
    if not path.is_dir():
        missing_shared_asset(f"the folder {path} (${SHARED_ENV} or ../shared)")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf(shared_dir: Path) -> Path:
    """The real SmolLM2-135M-Instruct GGUF (Q4_1) from the shared assets."""
    return shared_file(shared_dir, "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def stories_dir(shared_dir: Path) -> Path:
    """The llama2.c stories260K checkpoint folder from the shared assets."""
    return shared_file(shared_dir, "models/stories260K/stories260K.bin").parent


TINY_CONTEXT = 2048


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(shared_dir: Path) -> Path:
    """The SmolLM2 tokenizer folder (tokenizer.json with its chat template) from the shared assets."""
    path = shared_dir / "tokenizers" / "smollm2"
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"{path}/tokenizer.json is missing from the shared assets")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose vocabulary fits the SmolLM2 tokenizer (fast to serve, real tokenizer): the model the
    server and gateway tests serve."""
    from tests.model_factory import save_tiny_model

    return save_tiny_model(
        "llama", tmp_path_factory.mktemp("tiny-llama-smollm2"), vocab_size=49152, max_position_embeddings=TINY_CONTEXT
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` skip, saying why, where torch sees no CUDA device (torch is imported only if one is marked,
    so a run of torch-free tests stays torch-free)."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    reason = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False); scripts/gpu-check.sh runs it")
    for item in marked:
        item.add_marker(reason)
