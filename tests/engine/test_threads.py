"""The engine's CPU threads (`num_threads` / `--threads`), the governor choosing them, and the watch for slow steps.

Given steps of one size with a steady median, when one takes many times as long, then exactly that
step is counted as slow; steps of another size are judged against their own median. Given step
times that depend on the thread count (a quiet machine: more is faster; a neighbour on a core:
fewer is faster), the governor runs the faster count nearly always and follows a change within a
few steps.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from ember import SamplingParams
from ember.engine.config import EngineConfig, add_engine_arguments
from ember.engine.threads import (
    GOVERNOR_MAX_INTERVAL,
    SLOW_STEP_FACTOR,
    SLOW_STEP_MIN_SAMPLES,
    SlowStepWatch,
    ThreadGovernor,
    apply_num_threads,
    thread_candidates,
)
from tests.engine.stories import stories_llm


def test_a_step_many_times_its_median_is_counted_once() -> None:
    watch = SlowStepWatch()
    flags = [watch.observe(1, 0.010) for _ in range(SLOW_STEP_MIN_SAMPLES)]
    flags.append(watch.observe(1, 0.010 * (SLOW_STEP_FACTOR + 1)))
    flags.append(watch.observe(1, 0.011))
    assert flags == [False] * SLOW_STEP_MIN_SAMPLES + [True, False]
    assert watch.num_slow_steps == 1


def test_a_long_prefill_is_not_slow_beside_decodes() -> None:
    watch = SlowStepWatch()
    for _ in range(SLOW_STEP_MIN_SAMPLES):
        watch.observe(1, 0.010)
    assert watch.observe(512, 0.5) is False  # its own size has no median yet
    assert watch.num_slow_steps == 0


def test_the_median_needs_enough_steps_before_it_judges() -> None:
    watch = SlowStepWatch()
    flags = [watch.observe(4, 0.01) for _ in range(SLOW_STEP_MIN_SAMPLES - 1)] + [watch.observe(4, 10.0)]
    assert not any(flags)


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_num_threads_must_be_a_positive_whole_number(value) -> None:
    with pytest.raises(ValueError, match="num_threads"):
        EngineConfig(model="x", num_threads=value)


def test_the_threads_flag_reaches_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args(["--model", "m", "--threads", "1"])).num_threads == 1
    assert EngineConfig.from_args(parser.parse_args(["--model", "m"])).num_threads is None


def test_apply_num_threads_sets_torch_and_none_keeps_it() -> None:
    before = torch.get_num_threads()
    try:
        assert apply_num_threads(1) == 1 == torch.get_num_threads()
        assert apply_num_threads(None) == 1
    finally:
        torch.set_num_threads(before)


def test_llm_num_threads_sets_the_step_threads(stories_dir) -> None:
    before = torch.get_num_threads()
    try:
        llm = stories_llm(stories_dir, num_threads=1)
        assert (llm.engine.num_threads, torch.get_num_threads()) == (1, 1)
        assert llm.engine.stats().num_slow_steps == 0
    finally:
        torch.set_num_threads(before)


QUIET = {2: 0.005, 1: 0.009}  # seconds per decode step: two threads win on a quiet machine
CONTENDED = {2: 0.020, 1: 0.011}  # a busy neighbour on one of two cores: one thread wins


def run_steps(governor: ThreadGovernor, durations: dict[int, float], steps: int, num_tokens: int = 1) -> list[int]:
    """The thread count of each of `steps` steps whose duration depends only on that count."""
    used = []
    for _ in range(steps):
        threads = governor.threads_for(num_tokens)
        governor.observe(durations[threads])
        used.append(threads)
    return used


@pytest.mark.parametrize(("max_threads", "expected"), [(1, (1,)), (2, (2, 1)), (3, (3, 2, 1)), (16, (16, 15, 8, 1))])
def test_the_governor_chooses_among_all_all_but_one_half_and_one(max_threads, expected) -> None:
    assert thread_candidates(max_threads) == expected


def test_on_a_quiet_machine_the_governor_keeps_all_threads_but_for_rare_tries() -> None:
    used = run_steps(ThreadGovernor(2, set_threads=lambda threads: None), QUIET, 1000)
    assert used[:4] == [2, 2, 1, 1]  # each count's first samples
    assert used[4:].count(1) <= 1000 // GOVERNOR_MAX_INTERVAL + 8  # tries back off while they lose


def test_a_neighbour_moves_the_governor_to_fewer_threads_and_its_departure_back() -> None:
    governor = ThreadGovernor(2, set_threads=lambda threads: None)
    run_steps(governor, QUIET, 300)
    contended = run_steps(governor, CONTENDED, 300)
    assert 1 in contended[:4]  # the chosen count slowed: switched within a few steps
    assert contended[10:].count(1) >= 0.9 * len(contended[10:])
    quiet_again = run_steps(governor, QUIET, 300)
    first_back = quiet_again.index(2)
    assert quiet_again[first_back + 3 * GOVERNOR_MAX_INTERVAL:].count(2) >= 0.9 * len(quiet_again[first_back + 3 * GOVERNOR_MAX_INTERVAL:])
    assert governor.num_changes == 2


def test_each_step_size_keeps_its_own_choice() -> None:
    governor = ThreadGovernor(2, set_threads=lambda threads: None)
    for _ in range(200):
        governor.observe(CONTENDED[governor.threads_for(1)])  # decode steps: one thread wins
        governor.observe({2: 0.30, 1: 0.55}[governor.threads_for(512)])  # prefill steps: two threads win
    assert governor.threads_for(1) == 1
    assert governor.threads_for(512) == 2


def test_the_governor_applies_a_count_only_when_it_changes() -> None:
    applied: list[int] = []
    used = run_steps(ThreadGovernor(2, set_threads=applied.append), QUIET, 200)
    changes = [threads for previous, threads in zip([None, *used[:-1]], used, strict=True) if threads != previous]
    assert applied == changes


def test_an_engine_governs_its_threads_unless_they_are_fixed(stories_dir) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        governed = stories_llm(stories_dir)
        fixed = stories_llm(stories_dir, num_threads=2)
        assert governed.engine.governor is not None and governed.engine.governor.candidates == (2, 1)
        assert fixed.engine.governor is None
        params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        prompts = ["Once upon a time", "Lily had a"]
        assert [o.outputs[0].token_ids for o in governed.generate(prompts, params)] == [
            o.outputs[0].token_ids for o in fixed.generate(prompts, params)]
        assert governed.engine.stats().num_threads in (1, 2)
        assert fixed.engine.stats().num_threads == 2
    finally:
        torch.set_num_threads(before)
