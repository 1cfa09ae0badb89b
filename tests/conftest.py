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
