"""The engine's CPU threads (`num_threads` / `--threads`) and its watch for slow steps.

Given steps of one size with a steady median, when one takes many times as long, then exactly that
step is counted as slow; steps of another size are judged against their own median.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from ember.engine.config import EngineConfig, add_engine_arguments
from ember.engine.threads import (
    SLOW_STEP_FACTOR,
    SLOW_STEP_MIN_SAMPLES,
    SlowStepWatch,
    apply_num_threads,
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
