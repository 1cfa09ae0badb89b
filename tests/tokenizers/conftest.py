"""Fixtures for the tokenizer tests: shared tokenizer files loaded once per session."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from ember.tokenizers import Tokenizer, load
from tests.shared_assets import shared_file


@pytest.fixture(scope="session")
def load_shared(shared_dir: Path) -> Callable[[str], Tokenizer]:
    """path relative to the shared assets -> its tokenizer, loaded once (big vocabularies
    take seconds to load; encoding does not change a tokenizer's results, only its caches)."""

    @cache
    def loader(relative: str) -> Tokenizer:
        return load(shared_file(shared_dir, relative))

    return loader
