"""CPU threads of the engine's step: a governor that follows the machine's load, and a watch for slow steps.

OpenMP's parallel regions end in a barrier, and its idle threads spin. When another process takes a
core, the thread sharing it is descheduled for whole time slices and every region of a step waits for
it: measured on a 2-vCPU VM (AMD EPYC, SmolLM2 Q4_1, batch-1 decode through `LLM.generate`), 180-210
tok/s alone fell to about 50 beside one busy loop, where one thread gives ~110 alone and ~90 beside
it. OMP_WAIT_POLICY=passive survived the loop (89) but cost two thirds of the quiet speed (a sleeping
vCPU is slow to wake for each of the few hundred regions of a step), so the default keeps spinning
and instead chooses, step by step, how many threads to use (`ThreadGovernor`): all of them while
that is fastest, fewer while a neighbour makes fewer faster. ember's kernels split work by output
rows, so a step's numbers do not depend on the thread count (greedy tokens and logprobs checked
bitwise equal at 1 and 2 threads); torch's own kernels may round differently.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

SLOW_STEP_FACTOR = 8.0  # a step this many times its size's running median is reported
SLOW_STEP_MIN_SAMPLES = 16  # steps of a size seen before its median is trusted
SLOW_STEP_WINDOW = 256  # recent steps of each size the median is taken over
SLOW_STEP_LOG_INTERVAL_S = 10.0  # at most one warning this often (the counter counts every one)


GOVERNOR_WINDOW = 5  # recent steps per (size, thread count) whose median stands for that count
GOVERNOR_MIN_SAMPLES = 2  # steps a count needs in a size before it is compared
GOVERNOR_FIRST_INTERVAL = 8  # steps of a size between two tries of another count, at first and after a change
GOVERNOR_MAX_INTERVAL = 64  # ... doubling up to this while the choice holds (a try costs a slower step)


def apply_num_threads(num_threads: int | None) -> int:
    """Give the step `num_threads` CPU threads (None: torch's own count, one per core); the count in use."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    return torch.get_num_threads()


def thread_candidates(max_threads: int) -> tuple[int, ...]:
    """The thread counts a governor of `max_threads` chooses among, most first: all, all but one
    (a neighbour on one core), half, one."""
    return tuple(sorted({max_threads, max(max_threads - 1, 1), max((max_threads + 1) // 2, 1), 1}, reverse=True))


class _SizeRecord:
    """What the governor knows of steps of one size: recent durations per thread count, and when to try another."""

    def __init__(self, size_class: int, candidates: tuple[int, ...]) -> None:
        self.smallest_step = 1 << (size_class - 1)  # tokens
        self.durations = {threads: collections.deque(maxlen=GOVERNOR_WINDOW) for threads in candidates}
        self.choice = candidates[0]
        self.interval = GOVERNOR_FIRST_INTERVAL
        self.steps_since_try = 0
        self.tries = 0  # the other counts are tried in turn

    def median(self, threads: int) -> float:
        """The median of `threads`' recent durations; infinite until it has `GOVERNOR_MIN_SAMPLES`."""
        ordered = sorted(self.durations[threads])
        return ordered[len(ordered) // 2] if len(ordered) >= GOVERNOR_MIN_SAMPLES else float("inf")


class ThreadGovernor:
    """Chooses the thread count of each step from how fast recent steps of its size ran with each count.

    Steps are grouped by size (scheduled tokens, rounded down to a power of two), since a decode step
    and a 512-token prefill do not scale alike. Within a size the count with the lowest recent median
    runs; another count is tried now and then (every `GOVERNOR_FIRST_INTERVAL` steps of the size,
    doubling to `GOVERNOR_MAX_INTERVAL` while tries lose), so a neighbour's arrival shows as the chosen
    count slowing down and its departure as tries that run faster. `set_threads` applies a count
    (torch's, which ember's kernels share).
    """

    def __init__(self, max_threads: int, set_threads: Callable[[int], None] = torch.set_num_threads) -> None:
        self.candidates = thread_candidates(max_threads)
        self.num_changes = 0  # times a size's choice moved to another count
        self._set_threads = set_threads
        self._applied: int | None = None
        self._sizes: dict[int, _SizeRecord] = {}
        self._pending: tuple[_SizeRecord, int] | None = None

    @property
    def threads(self) -> int:
        """The count the latest step ran with."""
        return self._applied if self._applied is not None else self.candidates[0]

    def threads_for(self, num_tokens: int) -> int:
        """Apply and return the thread count for a step of `num_tokens`; `observe` its duration after."""
        size_class = max(num_tokens, 1).bit_length()
        record = self._sizes.get(size_class) or self._sizes.setdefault(size_class, _SizeRecord(size_class, self.candidates))
        threads = self._choose(record)
        if threads != self._applied:
            self._set_threads(threads)
            self._applied = threads
        self._pending = (record, threads)
        return threads

    def observe(self, duration_s: float) -> None:
        """Record how long the step `threads_for` prepared took, and update its size's choice."""
        if self._pending is None:
            return
        record, threads = self._pending
        self._pending = None
        if threads != record.choice:  # a try: a win brings the next one closer, a loss pushes it back
            won = duration_s < record.median(record.choice)
            record.interval = GOVERNOR_FIRST_INTERVAL if won else min(record.interval * 2, GOVERNOR_MAX_INTERVAL)
        record.durations[threads].append(duration_s)
        best = min(self.candidates, key=record.median)
        if record.median(best) < record.median(record.choice):
            self._change(record, best)

    def _choose(self, record: _SizeRecord) -> int:
        if len(record.durations[record.choice]) >= GOVERNOR_MIN_SAMPLES:
            for threads in self.candidates:
                if len(record.durations[threads]) < GOVERNOR_MIN_SAMPLES:
                    return threads  # every count gets its first samples early
        record.steps_since_try += 1
        if record.steps_since_try < record.interval or len(self.candidates) == 1:
            return record.choice
        record.steps_since_try = 0
        others = [threads for threads in self.candidates if threads != record.choice]
        record.tries += 1
        return others[record.tries % len(others)]

    def _change(self, record: _SizeRecord, threads: int) -> None:
        logger.info("steps of %d+ tokens now run on %d thread(s): %.4f s against %.4f s on %d",
                    record.smallest_step, threads, record.median(threads), record.median(record.choice), record.choice)
        record.choice = threads
        record.interval = GOVERNOR_FIRST_INTERVAL
        record.steps_since_try = 0
        self.num_changes += 1


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
            "Another process is likely competing for the CPUs: give the engine its own cores (taskset) or fixed --threads.",
            num_tokens, duration_s, duration_s / median_s, median_s, self.num_slow_steps,
        )
