"""Where the read-only shared assets (real models, reference tokenizers, corpora) lie, and what a
test does when they are not there.

A missing asset FAILS the test with a message saying where to put it: a suite that skips its
real-model and reference checks without a word would pass while checking nothing. A user who
knowingly runs without the assets sets `EMBER_SHARED_OPTIONAL=1`; those tests are then skipped
with the same message as their reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_ENV = "EMBER_SHARED"
OPTIONAL_ENV = "EMBER_SHARED_OPTIONAL"


def shared_dir_candidate() -> Path:
    """`$EMBER_SHARED` if set, else the `shared` folder beside the repository."""
    candidate = os.environ.get(SHARED_ENV)
    return Path(candidate) if candidate else REPO_ROOT.parent / "shared"


def is_shared_optional() -> bool:
    return os.environ.get(OPTIONAL_ENV, "").strip().lower() in ("1", "true", "yes")


def missing_shared_asset(what: Path | str) -> NoReturn:
    """Fail (or, with EMBER_SHARED_OPTIONAL=1, skip) the current test: `what` is not in the shared assets."""
    message = (
        f"shared test asset missing: {what}. Put the shared assets (models/, tokenizers/, corpus/) at "
        f"{REPO_ROOT.parent / 'shared'} or point ${SHARED_ENV} at their folder; "
        f"to run without them on purpose, set {OPTIONAL_ENV}=1 and these tests are skipped."
    )
    if is_shared_optional():
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def shared_file(shared_dir: Path, relative: str) -> Path:
    """`shared_dir / relative`, which must exist (else the test fails, or skips when optional)."""
    path = shared_dir / relative
    if not path.exists():
        missing_shared_asset(path)
    return path
