"""The n-gram index and the adaptive draft length (costs, catch-ups, probes), on exact token lists and numbers."""

from __future__ import annotations

import pytest

from ember.engine.config import SpeculativeConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.request import Request, Sequence, SequenceStatus
from ember.engine.sampling_params import SamplingParams
from ember.engine.spec.ngram import NgramIndex
from ember.engine.spec.speculator import (
    Acceptance,
    Speculator,
    StepTimeFit,
    best_draft_length,
    expected_tokens,
)
from ember.layers.rejection_sampler import DraftRow


def test_the_longest_suffix_match_wins_and_its_latest_occurrence_is_used() -> None:
    index = NgramIndex(sizes=(3, 2))
    tokens = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3]
    index.update(tokens)

    assert index.continuation(tokens, 3) == [9, 9, 5]  # (1, 2, 3) seen at the start
    tokens += [4, 2, 3]
    index.update(tokens)
    assert index.continuation(tokens, 2) == [4, 2]  # (2, 3) most recently before 4


def test_the_occurrence_that_agrees_furthest_back_wins_over_a_later_one() -> None:
    """A copy in progress: (5, 6) recurs later, but only the first occurrence is preceded by (3, 4) as the sequence is."""
    index = NgramIndex(sizes=(2,))
    tokens = [3, 4, 5, 6, 7, 8, 0, 5, 6, 9, 9, 1, 3, 4, 5, 6]
    index.update(tokens)
    assert index.continuation(tokens, 3) == [7, 8, 0]


def test_no_match_drafts_nothing_and_the_index_grows_incrementally() -> None:
    index = NgramIndex(sizes=(2,))
    tokens = [1, 2, 3, 4]
    index.update(tokens)
    assert index.continuation(tokens, 4) == []
    tokens += [1, 2]
    index.update(tokens)
    assert index.num_indexed == 6
    assert index.continuation(tokens, 4) == [3, 4, 1, 2]


def test_expected_tokens_is_the_truncated_geometric_mean() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == 1.75  # 1 + 0.5 + 0.25


def test_draft_length_follows_acceptance_and_cost() -> None:
    assert best_draft_length(0.9, 0.05, 4) == 4
    assert best_draft_length(0.1, 0.05, 4) == 0  # drafts that are rarely kept do not pay
    assert best_draft_length(0.9, 1.0, 4) == 0  # a scored token as costly as a step never pays
    # a tree scoring 6 positions per level of depth costs six times a chain's: the same acceptance buys less depth
    assert best_draft_length(0.8, 0.05, 4) == 4 and best_draft_length(0.8, 0.05, 4, lambda k: 6 * k) == 3


def test_acceptance_counts_runs_ended_by_a_rejection() -> None:
    acceptance = Acceptance(kept=0.0, tried=0.0)
    acceptance.record(num_drafted=4, num_accepted=4)  # 4 kept, none rejected
    acceptance.record(num_drafted=4, num_accepted=1)  # 1 kept, then a rejection
    assert acceptance.kept == 0.9 * 4 + 1
    assert acceptance.tried == 0.9 * 4 + 2


class PricedProposer:
    """A proposer with fixed costs that drafts token 7 wherever it is asked (the target's choice decides acceptance)."""

    def __init__(self, draft_s: float | None, catch_up_s: float) -> None:
        self.draft_s = draft_s
        self.catch_up_s = catch_up_s
        self.asked: list[int] = []

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        self.asked.append(sum(wanted.values()))
        return {seq.seq_id: DraftRow([7] * k) for seq, k in wanted.items()}

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        return num_drafts

    def draft_token_cost_s(self) -> float | None:
        return self.draft_s

    def catch_up_cost_s(self, seq: Sequence) -> float:
        return self.catch_up_s

    def retain(self, seq_ids: set[str]) -> None:
        pass


def _decoding(max_tokens: int, num_prompt: int = 8) -> Sequence:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    tokens = list(range(num_prompt + 1))
    seq = Sequence("s", Request(EngineRequest("r", tokens[:num_prompt], params)), 0, tokens, num_prompt)
    seq.status = SequenceStatus.RUNNING
    seq.num_computed_tokens = len(tokens) - 1
    return seq


def _timed_speculator(proposer: PricedProposer, step_s: float = 0.02, per_token_s: float = 0.001) -> Speculator:
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=4), proposer)
    for n in (5, 1, 1, 1, 1):  # a verification of 4 drafts and plain decodes: the fit knows base time and slope
        speculator.observe_step(n, n - 1, step_s + per_token_s * (n - 1), decode_shaped=True)
    return speculator


def test_prompt_chunks_leave_the_cost_of_a_drafted_token_alone() -> None:
    timed = _timed_speculator(PricedProposer(draft_s=None, catch_up_s=0.0))
    with_prefill = _timed_speculator(PricedProposer(draft_s=None, catch_up_s=0.0))
    with_prefill.observe_step(512, 0, 0.2, decode_shaped=False)  # a prompt chunk: 0.35 ms a token, not 1 ms
    assert with_prefill.extra_token_cost(1) == pytest.approx(timed.extra_token_cost(1)) == pytest.approx(0.05)
    control = _timed_speculator(PricedProposer(draft_s=None, catch_up_s=0.0))
    control.observe_step(512, 0, 0.2, decode_shaped=True)
    assert control.extra_token_cost(1) < 0.04  # the same step fitted would have cheapened drafts


def test_a_draft_model_waits_for_the_target_step_time_before_it_drafts() -> None:
    speculator = Speculator(SpeculativeConfig(method="ngram"), PricedProposer(draft_s=0.002, catch_up_s=0.0))
    assert speculator.propose([_decoding(max_tokens=100)]) == {}
    cheap_lookup = Speculator(SpeculativeConfig(method="ngram"), PricedProposer(draft_s=None, catch_up_s=0.0))
    assert cheap_lookup.propose([_decoding(max_tokens=100)])  # nothing to weigh: drafts on the prior


def test_a_catch_up_is_paid_only_when_the_remaining_tokens_can_pay_it_back() -> None:
    proposer = PricedProposer(draft_s=0.004, catch_up_s=0.5)
    speculator = _timed_speculator(proposer)
    assert speculator.propose([_decoding(max_tokens=20)]) == {}  # 20 tokens cannot save 2 x 0.5 s
    assert speculator.propose([_decoding(max_tokens=2000)])["s"].token_ids


@pytest.mark.parametrize(
    ("draft_s", "catch_up_s", "longest"),
    [(0.004, 0.001, 256), (0.004, 0.0, 64), (None, 0.0, 16)],
    ids=["draft-model", "priced-drafting", "free-lookup"],
)
def test_probes_that_fail_back_off_as_far_as_the_proposers_drafting_costs(draft_s, catch_up_s, longest) -> None:
    proposer = PricedProposer(draft_s=draft_s, catch_up_s=catch_up_s)
    speculator = _timed_speculator(proposer)
    seq = _decoding(max_tokens=100_000)
    for _ in range(20):
        speculator.record(seq, 4, 0)  # every draft rejected: drafting stops
    probes = [step for step in range(1, 2000) if speculator.propose([seq])]
    gaps = [later - earlier for earlier, later in zip([0, *probes], probes, strict=False)]
    assert gaps[:4] == [min(gap, longest) for gap in (16, 32, 64, 128)]
    assert max(gaps) == longest and gaps[-1] == longest


def test_a_draft_model_that_pays_only_at_full_acceptance_does_not_probe() -> None:
    # Drafting costs 0.7 of a step per token (0.65 drafted + 0.05 scored): K = 4 would pay at 100% acceptance
    # (5 tokens for 3.8 steps) but not at the prior's 75% (3.05 for 3.8), so a probe's catch-up never pays back.
    costly = _timed_speculator(PricedProposer(draft_s=0.013, catch_up_s=0.05))
    cheap = _timed_speculator(PricedProposer(draft_s=0.004, catch_up_s=0.05))
    seq = _decoding(max_tokens=100_000)
    for speculator in (costly, cheap):
        for _ in range(20):
            speculator.record(seq, 4, 0)  # every draft rejected: drafting stops
    assert not any(costly.propose([seq]) for _ in range(1000))
    assert any(cheap.propose([seq]) for _ in range(1000))  # control: a cheap draft model still probes


def test_the_step_fit_predicts_unseen_sizes_only_once_it_knows_a_slope() -> None:
    fit = StepTimeFit()
    fit.add(1, 0.02)
    fit.add(1, 0.02)
    assert fit.predict_s(1) == pytest.approx(0.02)  # the size it has seen
    assert fit.predict_s(5) is None
    fit.add(100, 0.119)
    fit.add(1, 0.02)
    fit.add(1, 0.02)
    assert fit.predict_s(5) == pytest.approx(0.024, rel=1e-6)  # 20 ms + 1 ms per token beyond the first


def test_a_fit_told_to_trust_two_timings_predicts_between_and_beyond_them() -> None:
    """A draft model's catch-up line from its calibration: 64 tokens in 55 ms, 256 in 125 ms (a fixed 31 ms + 0.37 ms a
    token), where 64 tokens' rate alone would put 376 tokens at 321 ms."""
    fit = StepTimeFit(min_weight=1.5)
    fit.add(64, 0.055)
    fit.add(256, 0.125)
    assert fit.predict_s(376) == pytest.approx(0.125 + 120 * 0.070 / 192, rel=1e-3)
    assert StepTimeFit().predict_s(376) is None  # the default asks for more timings first


def test_a_new_sequence_starts_from_what_every_sequence_has_been_accepting() -> None:
    """A draft costing 0.7 of a step per token pays at full acceptance, not at the fixed prior's 3 of 4: a new sequence
    drafts at once where earlier sequences kept every draft, and not on an engine with no track record."""
    proven = _timed_speculator(PricedProposer(draft_s=0.013, catch_up_s=0.0))
    earlier = _decoding(max_tokens=100_000)
    earlier.seq_id = "earlier"
    for _ in range(30):
        proven.record(earlier, 4, 4)
    fresh = _timed_speculator(PricedProposer(draft_s=0.013, catch_up_s=0.0))
    assert proven.propose([_decoding(max_tokens=100_000)])["s"].token_ids == [7, 7, 7, 7]
    assert fresh.propose([_decoding(max_tokens=100_000)]) == {}


def _decoding_batch(size: int, params: SamplingParams | None = None) -> list[Sequence]:
    params = params or SamplingParams(temperature=0.0, max_tokens=100)
    batch = []
    for i in range(size):
        seq = Sequence(f"s{i}", Request(EngineRequest(f"r{i}", list(range(8)), params)), 0, list(range(9)), 8)
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = 8
        batch.append(seq)
    return batch


def _kept_everything(rows_per_pass: int | None) -> Speculator:
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=8), PricedProposer(draft_s=None, catch_up_s=0.0),
                            rows_per_pass=rows_per_pass)
    for _ in range(20):  # every draft kept: adaptive K wants the whole cap
        speculator.record(_decoding(max_tokens=100), 8, 8)
    return speculator


def test_drafts_fill_the_last_weight_pass_and_never_start_another() -> None:
    """Products in passes of 8 rows (GGML blocks): 1 + 7 rows at batch 1, 4 x 2 at batch 4, none at batch 8."""
    def depths(speculator: Speculator, size: int) -> list[int]:
        return [len(row.token_ids) for row in speculator.propose(_decoding_batch(size)).values()]

    passes = _kept_everything(rows_per_pass=8)
    assert depths(passes, 1) == [7]
    assert depths(passes, 4) == [1, 1, 1, 1]
    assert depths(passes, 8) == []
    assert depths(_kept_everything(rows_per_pass=None), 1) == [8]  # a smooth step time: the whole cap
    seeded = SamplingParams(temperature=0.8, seed=3, max_tokens=100)  # its output must not follow its neighbours
    assert [len(row.token_ids) for row in passes.propose(_decoding_batch(8, seeded)).values()] == [8] * 8
