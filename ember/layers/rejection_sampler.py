"""Speculative verification: keep a prefix of the drafted tokens so the output is exactly the target's.

Every proposer (n-gram, draft model) hands the same rule its drafts. Draft token i was drawn
from q_i; the target gives p_i at the same position (both after the row's temperature, top-k,
top-p and min-p, applied by the one `filtered_probs`). Draft i is kept with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection one token is drawn from
norm(max(0, p_i - q_i)) instead and the rest are dropped; when all K are kept, a bonus token is
drawn from p_K. Each emitted token is then distributed exactly as the target would have sampled
it (Leviathan et al. 2023, Chen et al. 2023). A proposer that drafts deterministically (n-gram
lookup) has q one-hot at its token, so the rule keeps d_i with probability p_i(d_i).

Greedy rows keep drafts while they equal the target's argmax and end with the target's argmax:
token for token what plain greedy decoding gives (the argmax of the same raw logits the plain
sampler takes it of). They need no probabilities and no random draws, so they skip both: a
verification step of a greedy row costs an argmax over its K+1 rows of logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.layers.draft_trees import MAX_TREE_NODES
from ember.layers.sampler import (
    SampledToken,
    SamplingRow,
    describe_position,
    filtered_probs,
    row_argmax,
)


@dataclass
class DraftRow:
    """One sequence's drafted tokens and, for a sampling proposer, the distributions they came from.

    `probs` is `[len(token_ids), vocab]` (already filtered by the row's params) or None for a
    deterministic proposer, whose q is one-hot at each drafted token.
    `parents` makes the drafts a tree (Medusa's candidates, verified greedily in one pass): node
    i continues node parents[i] (-1: the sequence's newest token); every parent comes before its
    children, so any first n nodes are a tree too. None: a chain, each token after the one before.
    """

    token_ids: list[int]
    probs: torch.Tensor | None = None
    parents: list[int] | None = None

    def __post_init__(self) -> None:
        if self.parents is not None:
            if self.probs is not None:
                raise ValueError("a tree of drafts is verified greedily: it cannot carry draft probabilities")
            if len(self.parents) != len(self.token_ids) or any(not -1 <= p < i for i, p in enumerate(self.parents)):
                raise ValueError("a tree's parents must name an earlier node (or -1) for every drafted token")
            if len(self.parents) > MAX_TREE_NODES:
                raise ValueError(f"a tree of drafts holds at most {MAX_TREE_NODES} tokens (the attention masks are 64 bits)")

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def depths(self) -> list[int]:
        """Each drafted token's distance from the sequence's newest token (1 for its children)."""
        if self.parents is None:
            return list(range(1, len(self.token_ids) + 1))
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    @property
    def depth(self) -> int:
        """The most tokens one verification can keep."""
        return max(self.depths(), default=0)

    def span_masks(self) -> list[int]:
        """Per scored position (the newest token, then each node): bits of the positions it sees, itself included."""
        masks = [1]
        for i, parent in enumerate(self.parents if self.parents is not None else range(-1, len(self.token_ids) - 1)):
            masks.append(masks[parent + 1] | 1 << (i + 1))
        return masks

    def truncated(self, num_tokens: int) -> DraftRow:
        """The first `num_tokens` drafted tokens (and their distributions)."""
        if num_tokens >= len(self.token_ids):
            return self
        return DraftRow(
            self.token_ids[:num_tokens],
            None if self.probs is None else self.probs[:num_tokens],
            None if self.parents is None else self.parents[:num_tokens],
        )


@dataclass
class Verified:
    """What verification decided for a batch: kept drafts per row and the one token drawn after them."""

    num_accepted: torch.Tensor  # [B] drafts kept
    final_token_ids: torch.Tensor  # [B] the resampled (on rejection) or bonus (all kept) token


def verify(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
) -> Verified:
    """The rejection rule over a padded batch of sampled (not greedy) rows.

    target_probs [B, K+1, V]: p at each draft position and the bonus position; draft_token_ids
    [B, K] (padding anywhere past `num_drafts`); draft_probs [B, K, V] or None (one-hot drafts);
    uniforms [B, K] in [0, 1); noise [B, V] exponential(1) for the final draw (exponential race).
    """
    batch, num_positions, vocab = target_probs.shape
    k = num_positions - 1
    rows = torch.arange(batch)
    positions = torch.arange(k)
    p_draft = target_probs[:, :k].gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)  # [B, K]
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)
    # u < p / q, written without a division (q > 0: the draft was drawn from q).
    accept = (uniforms * q_draft < p_draft) & (positions < num_drafts.unsqueeze(1))
    num_accepted = accept.int().cumprod(dim=1).sum(dim=1)  # length of the kept prefix
    final = _final_distribution(target_probs, draft_token_ids, draft_probs, num_accepted, num_drafts, rows, vocab)
    return Verified(num_accepted, (final / noise).argmax(dim=-1))


def verify_greedy(logits: torch.Tensor, draft_token_ids: list[int]) -> tuple[int, int]:
    """The greedy rule for one row: (drafts kept, final token) from its logits [K+1, V] at the K+1 scored positions.

    Drafts are kept while they equal the argmax; the final token is the argmax after the last kept one.
    """
    argmax = row_argmax(logits)
    num_accepted = 0
    while num_accepted < len(draft_token_ids) and draft_token_ids[num_accepted] == argmax[num_accepted]:
        num_accepted += 1
    return num_accepted, argmax[num_accepted]


def greedy_tree_path(argmax: list[int], draft: DraftRow) -> list[int]:
    """The nodes greedy decoding would have produced, root to leaf: from the newest token (argmax[0]) each step
    follows the child whose token is the target's argmax at its parent (node i's argmax is argmax[i + 1])."""
    parents = draft.parents if draft.parents is not None else list(range(-1, len(draft.token_ids) - 1))
    path: list[int] = []
    current = -1
    while True:
        wanted = argmax[current + 1]
        child = next((i for i, p in enumerate(parents) if p == current and draft.token_ids[i] == wanted), None)
        if child is None:
            return path
        path.append(child)
        current = child


def _final_distribution(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_accepted: torch.Tensor,
    num_drafts: torch.Tensor,
    rows: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """norm(max(0, p - q)) at the first rejected position; p itself at the bonus position."""
    p = target_probs[rows, num_accepted]  # [B, V]
    k = draft_token_ids.shape[1]
    rejected = num_accepted < num_drafts
    if k == 0:
        return p
    at = num_accepted.clamp(max=k - 1)
    if draft_probs is None:
        q = torch.nn.functional.one_hot(draft_token_ids[rows, at], vocab).to(p.dtype)
    else:
        q = draft_probs[rows, at]
    residual = (p - q).clamp(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    # p == q up to rounding leaves no residual mass; rejection then had probability ~0 and p is exact.
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p)
    return torch.where(rejected.unsqueeze(1), residual, p)


class RejectionSampler:
    """Verifies each row's drafts against the target logits at its K+1 scored positions.

    Random draws of a seeded row come from that row's own generator (K uniforms and one
    exponential per vocabulary entry, a fixed count per step), so a seeded request's output
    does not depend on what shares its batch.
    """

    def __init__(self, generator: torch.Generator) -> None:
        self._generator = generator

    def __call__(self, logits: list[torch.Tensor], rows: list[SamplingRow], drafts: list[DraftRow]) -> list[list[SampledToken]]:
        """`logits[b]` is `[len(drafts[b].token_ids) + 1, vocab]`; returns the emitted tokens of each row."""
        sampled = [b for b, row in enumerate(rows) if not row.params.is_greedy]
        verdicts = self._verify_sampled([logits[b] for b in sampled], [rows[b] for b in sampled], [drafts[b] for b in sampled])
        sampled_verdicts = dict(zip(sampled, verdicts, strict=True))
        emitted = []
        for b, (row_logits, row, draft) in enumerate(zip(logits, rows, drafts, strict=True)):
            num_accepted, final = sampled_verdicts[b] if b in sampled_verdicts else verify_greedy(row_logits, draft.token_ids)
            emitted.append(self._emitted(row_logits, draft.token_ids[:num_accepted] + [final], row))
        return emitted

    def _verify_sampled(self, logits: list[torch.Tensor], rows: list[SamplingRow], drafts: list[DraftRow]) -> list[tuple[int, int]]:
        """(drafts kept, final token) of each sampled row, by the rejection rule over the padded batch."""
        if not rows:
            return []
        vocab = logits[0].shape[-1]
        k = max(len(d.token_ids) for d in drafts)
        batch = len(rows)
        target_logits = torch.zeros(batch, k + 1, vocab)
        draft_ids = torch.zeros(batch, k, dtype=torch.long)
        has_probs = any(d.probs is not None for d in drafts)
        draft_probs = torch.zeros(batch, k, vocab) if has_probs else None
        for b, (row_logits, draft) in enumerate(zip(logits, drafts, strict=True)):
            n = len(draft.token_ids)
            target_logits[b, : n + 1] = row_logits.float()
            draft_ids[b, :n] = torch.tensor(draft.token_ids, dtype=torch.long)
            if draft_probs is not None:
                draft_probs[b, :n] = draft.probs if draft.probs is not None else torch.nn.functional.one_hot(draft_ids[b, :n], vocab)
        target_probs = filtered_probs(target_logits.reshape(-1, vocab), [row.params for row in rows for _ in range(k + 1)])
        num_drafts = torch.tensor([len(d.token_ids) for d in drafts])
        uniforms, noise = self._draws(num_drafts, k, vocab, rows)
        verified = verify(target_probs.reshape(batch, k + 1, vocab), draft_ids, num_drafts, draft_probs, uniforms, noise)
        return list(zip(verified.num_accepted.tolist(), verified.final_token_ids.tolist(), strict=True))

    def _draws(self, num_drafts: torch.Tensor, k: int, vocab: int, rows: list[SamplingRow]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = len(rows)
        uniforms = torch.rand(batch, k, generator=self._generator)
        noise = torch.empty(batch, vocab).exponential_(generator=self._generator)
        for b, row in enumerate(rows):
            if row.generator is not None:
                n = int(num_drafts[b])
                uniforms[b, :n] = torch.rand(n, generator=row.generator)
                noise[b].exponential_(generator=row.generator)
        return uniforms, noise

    @staticmethod
    def _emitted(logits: torch.Tensor, token_ids: list[int], row: SamplingRow) -> list[SampledToken]:
        num_top = row.params.logprobs
        if num_top is None:
            return [SampledToken(token_id) for token_id in token_ids]
        logprobs = torch.log_softmax(logits[: len(token_ids)].float(), dim=-1)
        return [describe_position(logprobs[i], token_id, num_top) for i, token_id in enumerate(token_ids)]
