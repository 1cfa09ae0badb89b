"""Fixtures shared by the whole suite: where the read-only shared assets lie."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def find_shared_dir() -> Path | None:
    """`$EMBER_SHARED` if set, else the `shared` folder beside the repository."""
    candidate = os.environ.get("EMBER_SHARED")
    path = Path(candidate) if candidate else REPO_ROOT.parent / "shared"
    return path if path.is_dir() else None


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared assets folder (models, tokenizers, corpus); skips the test when absent."""
    path = find_shared_dir()
    if path is None:
        pytest.skip("shared assets not found: set EMBER_SHARED or place them at ../shared")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf(shared_dir: Path) -> Path:
    """The real SmolLM2-135M-Instruct GGUF (Q4_1) from the shared assets."""
    path = shared_dir / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing from the shared assets")
    return path


@pytest.fixture(scope="session")
def stories_dir(shared_dir: Path) -> Path:
    """The llama2.c stories260K checkpoint folder from the shared assets."""
    path = shared_dir / "models" / "stories260K"
    if not (path / "stories260K.bin").is_file():
        pytest.skip(f"{path}/stories260K.bin is missing from the shared assets")
    return path
