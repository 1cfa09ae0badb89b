"""The prompt-lookup ceiling: an oracle's tokens per step bound what the n-gram proposer keeps on the same text."""

from __future__ import annotations

import random

import pytest

from ember.bench.lookup_ceiling import LookupCeiling, lookup_ceiling, overall_ceiling
from ember.engine.spec.ngram import NgramIndex


def test_an_output_copied_from_the_prompt_keeps_the_full_depth_every_step():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    output = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # token 1 from the prefill, then 10 copied tokens
    ceiling = lookup_ceiling(prompt, output, depth=4)
    assert ceiling == LookupCeiling(tokens=10, steps=2)  # 5 tokens per step: 4 kept drafts and the target's own


def test_text_that_never_recurs_gains_nothing():
    ceiling = lookup_ceiling([1, 2, 3], [10, 11, 12, 13, 14], depth=4)
    assert ceiling.tokens_per_step == 1.0 and ceiling.steps == 4


def test_the_oracle_cannot_copy_tokens_the_sequence_does_not_hold_yet():
    # The output repeats only itself: each copy can reach no further than the tokens already produced.
    output = [7, 8, 7, 8, 7, 8, 7, 8, 7]
    ceiling = lookup_ceiling([1], output, depth=8)
    assert ceiling.tokens == 8
    assert ceiling.steps == 4  # 8 | 7 | 8 7 8 | 7 8 7: a copy reaches no further than the tokens already produced


def test_the_ngram_proposer_never_keeps_more_per_step_than_the_ceiling():
    rng = random.Random(0)
    for _ in range(20):
        vocab = rng.randint(3, 12)
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(5, 60))]
        output = [rng.randrange(vocab) if rng.random() < 0.4 else prompt[rng.randrange(len(prompt))] for _ in range(rng.randint(2, 60))]
        for depth in (1, 4, 8):
            assert _proposer_steps(prompt, output, depth) >= lookup_ceiling(prompt, output, depth).steps


def _proposer_steps(prompt: list[int], output: list[int], depth: int) -> int:
    """Steps the engine's n-gram index (sizes 4..1) needs for `output`'s decode tokens at greedy verification."""
    index = NgramIndex((4, 3, 2, 1))
    text, position, steps = prompt + output, len(prompt) + 1, 0
    while position < len(text):
        held = text[:position]
        index.update(held)
        draft = index.continuation(held, depth)
        kept = next((i for i, token in enumerate(draft) if position + i >= len(text) or token != text[position + i]), len(draft))
        position += kept + 1
        steps += 1
    return steps


def test_the_overall_ceiling_speeds_up_only_the_decode_share():
    assert overall_ceiling(2.0, 1.0) == pytest.approx(2.0)
    assert overall_ceiling(2.0, 0.0) == pytest.approx(1.0)
    assert overall_ceiling(3.0, 0.75) == pytest.approx(1 / (0.25 + 0.25))


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        lookup_ceiling([1, 2], [1, 2], depth=0)


def test_the_spec_bench_bounds_each_workload_from_its_plain_runs_outputs_and_decode_share():
    from ember.bench.results import RequestTiming, RunResult
    from ember.bench.spec import _lookup_ceiling, decode_share
    from ember.bench.workloads import BenchRequest, Workload

    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    workload = Workload("copy", 0, [BenchRequest("r0", prompt, 11)], {}, "generated")

    def plain(decode_s: float) -> RunResult:
        timing = RequestTiming("r0", "main", len(prompt), 11, arrival=0.0, first_token=1.0, finished=1.0 + decode_s,
                               output_token_ids=prompt[:11])
        return RunResult("ember", "copy", 4.0, 11, [timing])

    runs = [plain(3.0), plain(1.0), plain(2.0)]  # decode shares 0.75, 0.25, 0.5: the median is 0.5
    assert decode_share(runs[0]) == pytest.approx(0.75)
    ceiling = _lookup_ceiling(workload, runs, depth=4)
    assert ceiling["decode"] == pytest.approx(5.0) and ceiling["decode_share"] == pytest.approx(0.5)
    assert ceiling["overall"] == pytest.approx(overall_ceiling(5.0, 0.5))
    assert ceiling["max_depth"] == 16 and ceiling["max_depth_decode"] == pytest.approx(10.0)  # the whole copy in one step
