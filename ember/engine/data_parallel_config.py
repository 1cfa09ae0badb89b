"""What `ember serve --data-parallel-size/--data-parallel-cpus` asks for, read without loading the engine.

Kept apart from `ember.engine.data_parallel` so the CLI and the server config can build and check it while
`ember serve --help` stays free of torch and the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DataParallelConfig:
    """`size` replicas; `cpus` (None: not pinned): the cores shared out among the replicas, each replica's process
    (and its ranks) kept to its contiguous share, with as many threads as cores in it (unless --threads says
    otherwise); a dead replica is restarted up to `max_restarts` times."""

    size: int = 1
    cpus: tuple[int, ...] | None = None
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= 64:
            raise ValueError(f"--data-parallel-size must be a whole number from 1 to 64, not {self.size!r}")
        if self.max_restarts < 0:
            raise ValueError(f"--data-parallel-max-restarts must be at least 0, not {self.max_restarts}")
        if self.cpus is not None:
            missing = sorted(set(self.cpus) - os.sched_getaffinity(0))
            if not self.cpus or missing:
                raise ValueError(f"--data-parallel-cpus: cores {missing or '(none)'} are not among this process's cores "
                                 f"{sorted(os.sched_getaffinity(0))}")

    @property
    def is_replicated(self) -> bool:
        """Whether serving goes through a DataParallelEngine (several replicas, or one pinned to given cores)."""
        return self.size > 1 or self.cpus is not None


def parse_cpus(text: str) -> tuple[int, ...]:
    """'all' (this process's cores), or a list like '0,2-3' -> (0, 2, 3); ValueError naming the flag otherwise."""
    if text == "all":
        return tuple(sorted(os.sched_getaffinity(0)))
    cores: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            cores.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise ValueError(f"--data-parallel-cpus {text!r}: give 'all' or cores like 0,1 or 0-3") from None
    return tuple(sorted(set(cores)))


def replica_cores(index: int, size: int, cores: list[int]) -> frozenset[int]:
    """Replica `index`'s share of `cores`: contiguous, as even as the count allows (one core each, shared round
    robin, when there are more replicas than cores)."""
    if size > len(cores):
        return frozenset({cores[index % len(cores)]})
    return frozenset(cores[index * len(cores) // size : (index + 1) * len(cores) // size])
