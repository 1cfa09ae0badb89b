"""The n-gram index and the adaptive draft length, on exact token lists and numbers."""

from __future__ import annotations

from ember.engine.spec.ngram import NgramIndex
from ember.engine.spec.speculator import Acceptance, best_draft_length, expected_tokens


def test_the_longest_suffix_match_wins_and_its_latest_occurrence_is_used() -> None:
    index = NgramIndex(sizes=(3, 2))
    tokens = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3]
    index.update(tokens)

    assert index.continuation(tokens, 3) == [9, 9, 5]  # (1, 2, 3) seen at the start
    tokens += [4, 2, 3]
    index.update(tokens)
    assert index.continuation(tokens, 2) == [4, 2]  # (2, 3) most recently before 4


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


def test_acceptance_counts_runs_ended_by_a_rejection() -> None:
    acceptance = Acceptance(kept=0.0, tried=0.0)
    acceptance.record(num_drafted=4, num_accepted=4)  # 4 kept, none rejected
    acceptance.record(num_drafted=4, num_accepted=1)  # 1 kept, then a rejection
    assert acceptance.kept == 0.9 * 4 + 1
    assert acceptance.tried == 0.9 * 4 + 2
