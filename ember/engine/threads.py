"""CPU threads of the engine's step, and a watch for steps that took many times their usual time.

The thread count is set where the engine starts (`apply_num_threads`); the OpenMP wait policy is
left as the environment says (the runtime reads it once, when torch loads it). Measured on a
2-vCPU VM (AMD EPYC, SmolLM2 Q4_1, batch-1 decode through `LLM.generate`, one run alternating):
the runtime's default (spinning) gives 180-210 tok/s alone and about 50 beside one busy loop;
OMP_WAIT_POLICY=PASSIVE gives 89 beside the loop but only 60-64 alone (a sleeping vCPU is slow to
wake for each of the few hundred parallel regions of a step), so it is not the default. On a
machine shared with CPU-bound work, `--threads 1` or OMP_WAIT_POLICY=passive trade quiet speed
for robustness; `ember bench contention` measures both on the machine at hand.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time

import torch

logger = logging.getLogger(__name__)

SLOW_STEP_FACTOR = 8.0  # a step this many times its size's running median is reported
SLOW_STEP_MIN_SAMPLES = 16  # steps of a size seen before its median is trusted
SLOW_STEP_WINDOW = 256  # recent steps of each size the median is taken over
SLOW_STEP_LOG_INTERVAL_S = 10.0  # at most one warning this often (the counter counts every one)


def apply_num_threads(num_threads: int | None) -> int:
    """Give the step `num_threads` CPU threads (None: torch's own count, one per core); the count in use."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    return torch.get_num_threads()


class SlowStepWatch:
    """Notices a step that took `SLOW_STEP_FACTOR` times the running median of steps of its size.

    Steps are compared within a size class (scheduled tokens, rounded down to a power of two): a
    512-token prefill is not slow next to a 1-token decode. A slow step is counted (`num_slow_steps`,
    exported as `ember:num_slow_steps`) and logged, at most once every `SLOW_STEP_LOG_INTERVAL_S`,
    naming the likely cause: another process competing for the CPUs.
    """

    def __init__(self) -> None:
        self.num_slow_steps = 0
        self._recent: dict[int, collections.deque[float]] = {}
        self._sorted: dict[int, list[float]] = {}
        self._last_warning_s = float("-inf")

    def observe(self, num_tokens: int, duration_s: float) -> bool:
        """Record one step; True when it was slow."""
        size = max(num_tokens, 1).bit_length()
        recent = self._recent.setdefault(size, collections.deque())
        ordered = self._sorted.setdefault(size, [])
        is_slow = len(recent) >= SLOW_STEP_MIN_SAMPLES and duration_s > SLOW_STEP_FACTOR * ordered[len(ordered) // 2]
        if is_slow:
            self.num_slow_steps += 1
            self._warn(num_tokens, duration_s, ordered[len(ordered) // 2])
        recent.append(duration_s)
        bisect.insort(ordered, duration_s)
        if len(recent) > SLOW_STEP_WINDOW:
            ordered.pop(bisect.bisect_left(ordered, recent.popleft()))
        return is_slow

    def _warn(self, num_tokens: int, duration_s: float, median_s: float) -> None:
        now = time.monotonic()
        if now - self._last_warning_s < SLOW_STEP_LOG_INTERVAL_S:
            return
        self._last_warning_s = now
        logger.warning(
            "a %d-token step took %.3f s, %.0fx the median of such steps (%.4f s); %d slow step(s) so far. "
            "Another process is likely competing for the CPUs: give the engine fewer --threads or its own cores.",
            num_tokens, duration_s, duration_s / median_s, median_s, self.num_slow_steps,
        )
