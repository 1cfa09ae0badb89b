"""Fixtures of the parallel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def single_thread_torch() -> Iterator[None]:
    """One torch thread per rank: the box has two cores for everyone; the workers inherit this."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
