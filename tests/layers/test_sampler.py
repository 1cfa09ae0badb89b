"""The sampler against the distributions it promises: filters, seeds, penalties, logprobs."""

from __future__ import annotations

import pytest
import torch

from ember.engine.sampling_params import SamplingParams
from ember.layers.sampler import Sampler, SamplingRow, row_argmax

LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))


def _row(seed: int | None = None, output: list[int] | None = None, **params) -> SamplingRow:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(SamplingParams(**params), prompt_token_ids=[], output_token_ids=output or [], generator=generator)


def _frequencies(row_factory, draws: int = 4000) -> torch.Tensor:
    sampler = Sampler(torch.Generator().manual_seed(0))
    rows = [row_factory() for _ in range(draws)]
    tokens = sampler(LOGITS.expand(draws, -1), rows)
    return torch.bincount(torch.tensor([t.token_id for t in tokens]), minlength=5).float() / draws


def test_greedy_takes_the_argmax():
    tokens = Sampler(torch.Generator())(LOGITS.unsqueeze(0), [_row(temperature=0)])
    assert tokens[0].token_id == 0


def test_temperature_one_samples_the_softmax_distribution():
    observed = _frequencies(lambda: _row(temperature=1.0))
    assert torch.allclose(observed, LOGITS.exp(), atol=0.03)


def test_top_k_keeps_only_the_k_most_likely():
    observed = _frequencies(lambda: _row(temperature=1.0, top_k=2))
    assert observed[2:].sum() == 0
    assert observed[0] == pytest.approx(2 / 3, abs=0.03)


def test_top_p_keeps_the_smallest_set_reaching_p():
    observed = _frequencies(lambda: _row(temperature=1.0, top_p=0.7))
    # 0.5 alone < 0.7, 0.5 + 0.25 >= 0.7: tokens 0 and 1 stay.
    assert observed[2:].sum() == 0 and observed[1] > 0


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    observed = _frequencies(lambda: _row(temperature=1.0, min_p=0.2))
    # threshold 0.2 * 0.5 = 0.1: tokens 3 (0.07) and 4 (0.03) go.
    assert observed[3:].sum() == 0 and observed[2] > 0


def test_a_seeded_row_draws_the_same_token_whatever_its_neighbours():
    sampler = Sampler(torch.Generator().manual_seed(0))
    flat = torch.zeros(1, 1000)
    alone = sampler(flat, [_row(seed=42, temperature=1.0)])[0].token_id
    crowd = [_row(temperature=1.0) for _ in range(7)] + [_row(seed=42, temperature=1.0)]
    together = sampler(flat.expand(8, -1), crowd)[-1].token_id
    assert together == alone


def test_frequency_and_presence_penalties_lower_repeated_tokens():
    sampler = Sampler(torch.Generator())
    row = _row(temperature=0, output=[0, 0, 0], frequency_penalty=0.5)
    assert sampler(LOGITS.unsqueeze(0), [row])[0].token_id == 1
    row = _row(temperature=0, output=[0], presence_penalty=1.0)
    assert sampler(LOGITS.unsqueeze(0), [row])[0].token_id == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    sampler = Sampler(torch.Generator())
    logits = torch.tensor([[2.0, 1.5, -1.0]])
    row = _row(temperature=0, output=[0], repetition_penalty=2.0)  # 2.0 -> 1.0 < 1.5
    assert sampler(logits, [row])[0].token_id == 1


def test_logit_bias_shifts_the_biased_logits_before_the_choice():
    sampler = Sampler(torch.Generator())
    assert sampler(LOGITS.unsqueeze(0), [_row(temperature=0, logit_bias={4: 100})])[0].token_id == 4
    assert sampler(LOGITS.unsqueeze(0), [_row(temperature=0, logit_bias={0: -100})])[0].token_id == 1
    # sampled: a bias of ln 2 on token 1 doubles its odds against every other token
    observed = _frequencies(lambda: _row(temperature=1.0, logit_bias={1: float(torch.log(torch.tensor(2.0)))}))
    expected = LOGITS.exp() * torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0])
    assert torch.allclose(observed, expected / expected.sum(), atol=0.03)


def test_allowed_token_ids_renormalise_the_distribution_over_them():
    observed = _frequencies(lambda: _row(temperature=1.0, allowed_token_ids=[1, 3]))
    expected = torch.zeros(5)
    expected[[1, 3]] = LOGITS.exp()[[1, 3]] / LOGITS.exp()[[1, 3]].sum()
    assert torch.allclose(observed, expected, atol=0.03)
    greedy = Sampler(torch.Generator())(LOGITS.unsqueeze(0), [_row(temperature=0, allowed_token_ids=[2, 4])])
    assert greedy[0].token_id == 2


def test_no_logit_bias_may_be_given_as_none():
    assert SamplingParams(logit_bias=None).logit_bias == {}


def test_logit_bias_leaves_a_row_without_one_untouched():
    sampler = Sampler(torch.Generator())
    tokens = sampler(LOGITS.expand(2, -1), [_row(temperature=0, logit_bias={3: 100}), _row(temperature=0)])
    assert [t.token_id for t in tokens] == [3, 0]


def test_logprobs_are_of_the_raw_distribution_with_ranks():
    sampler = Sampler(torch.Generator())
    row = _row(temperature=0, logprobs=2, output=[0], presence_penalty=2.0)
    token = sampler(LOGITS.unsqueeze(0), [row])[0]
    assert token.token_id == 1  # penalty moved the choice ...
    assert token.logprob == pytest.approx(float(LOGITS[1]))  # ... not the reported logprob
    assert token.rank == 2
    assert token.top_token_ids == [0, 1]


@pytest.mark.parametrize(
    "bad",
    [dict(temperature=-1), dict(top_p=0), dict(top_k=-5), dict(n=0), dict(max_tokens=0), dict(logprobs=50), dict(min_p=2),
     dict(seed=2**63), dict(seed=-(2**63) - 1), dict(logit_bias={1: 101}), dict(logit_bias={-1: 1.0}), dict(logit_bias={"1": 1.0})],
)
def test_invalid_sampling_parameters_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_seeds_span_the_signed_64_bit_range_as_the_api_documents():
    for seed in (-(2**63), 2**63 - 1):
        assert SamplingParams(seed=seed).seed == seed


def test_a_top_k_beyond_any_vocabulary_keeps_every_token():
    """Any integer top_k is valid (the API bounds it below only); one past int64 must not overflow a tensor."""
    from ember.layers.sampler import filtered_probs

    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    huge = filtered_probs(logits, [SamplingParams(temperature=0.8, top_k=2**63), SamplingParams(temperature=0.8, top_k=50)])
    off = filtered_probs(logits, [SamplingParams(temperature=0.8)] * 2)
    assert torch.equal(huge, off)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_argmax_is_torch_argmax_with_ties_and_nans(dtype):
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(3)).to(dtype)
    logits[1, [10, 700]] = 50.0  # a tie: the first index wins
    logits[2, 400] = float("nan")  # a NaN counts as the largest
    logits[3] = float("-inf")
    logits[3, 999] = 0.0
    logits[4] = 1.0  # every entry equal
    assert row_argmax(logits) == logits.argmax(dim=-1).tolist()
    assert row_argmax(logits)[1:5] == [10, 400, 999, 0]
    assert row_argmax(logits[:, ::2]) == logits[:, ::2].argmax(dim=-1).tolist()  # a strided view
