"""The rejection sampler is lossless: continuations with speculation follow the target's distribution.

The "models" are tiny bigram tables (the next token's logits depend on the last token), so the
exact distribution of a 3-token continuation is a product of known probabilities and a
chi-square test over 100,000 vectorised continuations can compare against it.
"""

from __future__ import annotations

import pytest
import torch

from ember.engine.sampling_params import SamplingParams
from ember.layers.rejection_sampler import DraftRow, RejectionSampler, greedy_tree_path, verify
from ember.layers.sampler import Sampler, SamplingRow, filtered_probs

VOCAB = 6
LENGTH = 3
NUM_SAMPLES = 100_000


def _bigram(seed: int) -> torch.Tensor:
    return torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5


def _probs(table: torch.Tensor, last: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Filtered next-token probabilities after each token of `last` (filtered once per table row)."""
    return filtered_probs(table, [params] * VOCAB)[last]


def _speculative_continuations(target, draft, params, k, use_draft_probs, generator, medusa_heads=None) -> torch.Tensor:
    """LENGTH tokens after token 0 for every sample, drafted k at a time and verified.

    With `medusa_heads` (k bigram tables), draft j comes from head j given the token before the
    drafts, as Medusa heads draft: q_j does not depend on the earlier drafts."""
    out = torch.full((NUM_SAMPLES, LENGTH), -1, dtype=torch.long)
    count = torch.zeros(NUM_SAMPLES, dtype=torch.long)
    last = torch.zeros(NUM_SAMPLES, dtype=torch.long)
    while bool((count < LENGTH).any()):
        rows = (count < LENGTH).nonzero().squeeze(1)
        n = len(rows)
        context = last[rows]
        drafted, draft_probs = [], []
        for j in range(k):
            q = _probs(draft, context, params) if medusa_heads is None else _probs(medusa_heads[j], last[rows], params)
            context = torch.multinomial(q, 1, generator=generator).squeeze(1)
            drafted.append(context)
            draft_probs.append(q)
        draft_ids = torch.stack(drafted, 1)
        conditions = torch.cat([last[rows].unsqueeze(1), draft_ids], 1)  # p_i conditions on the token before it
        target_probs = _probs(target, conditions.reshape(-1), params).reshape(n, k + 1, VOCAB)
        uniforms = torch.rand(n, k, generator=generator)
        noise = torch.empty(n, VOCAB).exponential_(generator=generator)
        verified = verify(
            target_probs, draft_ids, torch.full((n,), k), torch.stack(draft_probs, 1) if use_draft_probs else None,
            uniforms, noise,
        )
        emitted = torch.cat([draft_ids, verified.final_token_ids.unsqueeze(1)], 1)
        for j in range(k + 1):
            # token j is emitted when j < num_accepted (a kept draft) or j == num_accepted (the final token)
            token = torch.where(verified.num_accepted > j, emitted[:, j], verified.final_token_ids)
            live = (j <= verified.num_accepted) & (count[rows] < LENGTH)
            out[rows[live], count[rows[live]]] = token[live]
            count[rows[live]] += 1
        last[rows] = verified.final_token_ids
    return out


def _target_distribution(target: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """P(a, b, c | start 0) = p(a | 0) p(b | a) p(c | b), flattened like the sample cells."""
    step = filtered_probs(target, [params] * VOCAB).double()  # [last, next]
    return torch.einsum("a,ab,bc->abc", step[0], step, step).reshape(-1)


def _chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    expected = expected_probs * observed.sum()
    assert observed[expected_probs == 0].sum() == 0, "a continuation the target can never produce was sampled"
    keep = expected_probs > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    degrees = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64), statistic / 2))


@pytest.mark.parametrize(
    "params, use_draft_probs",
    [
        (SamplingParams(temperature=0.7), True),
        (SamplingParams(temperature=1.0), True),
        (SamplingParams(temperature=0.7, top_k=4), True),
        (SamplingParams(temperature=1.0, top_p=0.8), True),
        (SamplingParams(temperature=1.0), False),  # n-gram: deterministic drafts, q one-hot
        (SamplingParams(temperature=0.7, top_p=0.9, top_k=5), False),
    ],
    ids=["t0.7", "t1.0", "t0.7-topk4", "t1.0-topp0.8", "t1.0-onehot", "t0.7-topp-topk-onehot"],
)
def test_speculative_continuations_follow_the_target_distribution(params, use_draft_probs):
    target, draft = _bigram(1), _bigram(2)
    samples = _speculative_continuations(target, draft, params, k=3, use_draft_probs=use_draft_probs,
                                         generator=torch.Generator().manual_seed(11))
    cells = (samples * torch.tensor([VOCAB**2, VOCAB, 1])).sum(1)
    observed = torch.bincount(cells, minlength=VOCAB**LENGTH).double()
    p_value = _chi_square_p_value(observed, _target_distribution(target, params))
    assert p_value > 0.01


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_p=0.8, top_k=4)],
                         ids=["t0.7", "t1.0-topp-topk"])
def test_medusa_shaped_drafts_that_ignore_earlier_drafts_keep_the_target_distribution(params):
    target, heads = _bigram(1), [_bigram(20 + j) for j in range(3)]
    samples = _speculative_continuations(target, None, params, k=3, use_draft_probs=True,
                                         generator=torch.Generator().manual_seed(12), medusa_heads=heads)
    cells = (samples * torch.tensor([VOCAB**2, VOCAB, 1])).sum(1)
    observed = torch.bincount(cells, minlength=VOCAB**LENGTH).double()
    assert _chi_square_p_value(observed, _target_distribution(target, params)) > 0.01


def test_the_chi_square_test_rejects_the_draft_distribution_itself():
    """The test has power: sampling from the draft alone is caught."""
    params = SamplingParams(temperature=1.0)
    target, draft = _bigram(1), _bigram(2)
    generator = torch.Generator().manual_seed(3)
    last = torch.zeros(NUM_SAMPLES, dtype=torch.long)
    tokens = []
    for _ in range(LENGTH):
        last = torch.multinomial(_probs(draft, last, params), 1, generator=generator).squeeze(1)
        tokens.append(last)
    cells = (torch.stack(tokens, 1) * torch.tensor([VOCAB**2, VOCAB, 1])).sum(1)
    observed = torch.bincount(cells, minlength=VOCAB**LENGTH).double()
    assert _chi_square_p_value(observed, _target_distribution(target, params)) < 1e-6


def _row(seed: int | None = None, **params) -> SamplingRow:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(SamplingParams(**params), [], [], generator)


def test_greedy_keeps_drafts_while_they_match_the_argmax_then_takes_the_argmax():
    logits = torch.full((4, VOCAB), -5.0)
    logits[torch.arange(4), torch.tensor([2, 3, 1, 4])] = 5.0  # argmax per position: 2, 3, 1, 4
    sampler = RejectionSampler(torch.Generator().manual_seed(0))
    [kept_two] = sampler([logits], [_row(temperature=0)], [DraftRow([2, 3, 0])])
    [all_kept] = sampler([logits], [_row(temperature=0)], [DraftRow([2, 3, 1])])
    [none_kept] = sampler([logits[:2]], [_row(temperature=0)], [DraftRow([5])])
    assert [t.token_id for t in kept_two] == [2, 3, 1]
    assert [t.token_id for t in all_kept] == [2, 3, 1, 4]  # the bonus token
    assert [t.token_id for t in none_kept] == [2]


def test_greedy_verification_takes_the_argmax_of_the_raw_logits_as_plain_greedy_sampling_does():
    """Two logits one float apart near 0 round to the same probability: the larger logit still wins."""
    logits = torch.full((2, VOCAB), -5.0)
    logits[:, 1] = 1e-3
    logits[:, 2] = torch.nextafter(torch.tensor(1e-3), torch.tensor(1.0))
    assert torch.softmax(logits, -1)[0, 1] == torch.softmax(logits, -1)[0, 2]  # tied as probabilities
    plain = Sampler(torch.Generator().manual_seed(0))(logits[:1], [_row(temperature=0)])
    [verified] = RejectionSampler(torch.Generator().manual_seed(0))([logits], [_row(temperature=0)], [DraftRow([2])])
    assert plain[0].token_id == 2
    assert [t.token_id for t in verified] == [2, 2]


def test_greedy_rows_draw_nothing_from_the_shared_random_stream():
    generator = torch.Generator().manual_seed(0)
    before = generator.get_state()
    RejectionSampler(generator)([torch.randn(3, VOCAB)], [_row(temperature=0)], [DraftRow([1, 2])])
    assert torch.equal(generator.get_state(), before)


def test_a_seeded_row_verifies_the_same_whatever_its_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB)
    sampler = RejectionSampler(torch.Generator().manual_seed(0))
    alone = sampler([logits], [_row(seed=5, temperature=1.0)], [DraftRow([1, 2, 3])])[0]
    others = [torch.randn(6, VOCAB) for _ in range(3)]
    crowd = sampler(
        others + [logits], [_row(temperature=1.0) for _ in range(3)] + [_row(seed=5, temperature=1.0)],
        [DraftRow([0, 1, 2, 3, 4]) for _ in range(3)] + [DraftRow([1, 2, 3])],
    )[-1]
    assert [t.token_id for t in crowd] == [t.token_id for t in alone]


def test_logprobs_are_the_targets_raw_logprobs_at_each_emitted_position():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4))
    sampler = RejectionSampler(torch.Generator().manual_seed(0))
    argmax = logits.argmax(-1).tolist()
    [tokens] = sampler([logits], [_row(temperature=0, logprobs=2)], [DraftRow(argmax[:2])])
    expected = torch.log_softmax(logits, -1)
    assert [t.token_id for t in tokens] == argmax
    for position, token in enumerate(tokens):
        assert token.logprob == pytest.approx(float(expected[position, token.token_id]))
        assert token.rank == 1 and len(token.top_token_ids) == 2


def test_a_tree_of_drafts_knows_its_depths_masks_and_greedy_path():
    # newest token -> 0 -> 2 -> 4, newest -> 1 -> 3
    tree = DraftRow([10, 11, 12, 13, 14], parents=[-1, -1, 0, 1, 2])
    assert tree.depths() == [1, 1, 2, 2, 3] and tree.depth == 3
    assert tree.span_masks() == [0b1, 0b11, 0b101, 0b1011, 0b10101, 0b101011]
    assert tree.truncated(3) == DraftRow([10, 11, 12], parents=[-1, -1, 0])
    # argmax per scored position: newest token, then nodes 0..4
    assert greedy_tree_path([11, 99, 13, 99, 99, 99], tree) == [1, 3]
    assert greedy_tree_path([10, 12, 99, 14, 99, 99], tree) == [0, 2, 4]
    assert greedy_tree_path([42, 0, 0, 0, 0, 0], tree) == []
    chain = DraftRow([5, 6, 7])
    assert chain.span_masks() == [0b1, 0b11, 0b111, 0b1111] and chain.depth == 3
    assert greedy_tree_path([5, 6, 8, 0], chain) == [0, 1]


def test_a_malformed_tree_is_refused_with_the_rule_it_breaks():
    with pytest.raises(ValueError, match="earlier node"):
        DraftRow([1, 2], parents=[-1, 1])
    with pytest.raises(ValueError, match="greedily"):
        DraftRow([1], probs=torch.ones(1, 4), parents=[-1])
    with pytest.raises(ValueError, match="at most 62"):
        DraftRow(list(range(63)), parents=[-1] * 63)
