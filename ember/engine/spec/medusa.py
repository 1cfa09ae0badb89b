"""Medusa proposer: the heads read the target's last hidden state and draft K tokens ahead at once.

After each step the runner hands over, per sequence, the target's final hidden state at the
position that drew the sequence's newest token (`LastHidden`). Head k turns it into a guess
for the token k + 1 places after that newest token. Drafting costs no target forward: one
product of the K heads' outputs with the LM head, for every drafting sequence together.

Greedy rows draft a tree when the runner verifies trees (`tree_nodes` > 0): node (r_1, ..., r_d) is
head d's r_d-th likeliest token after the node (r_1, ..., r_(d-1)); the tree holds the `tree_nodes`
rank paths likeliest under `RANK_PRIOR` (each head's chance that its r-th token is right, as a
product along the path), so it is wide near the root and thin deep down, as Medusa's trees are.
The target scores every node in one pass, each node seeing only its ancestors, and keeps the
path greedy decoding takes. Without trees greedy rows draft a chain of each head's argmax.
Sampling rows draw each head's token from the head's distribution after the row's own
temperature, top-k, top-p and min-p (`filtered_probs`, as the target's p is filtered) and hand
that q to the rejection sampler, which keeps the output the target's. The heads do not see
earlier drafts, so q_k does not depend on them: still a valid proposal for the rejection rule.
"""

from __future__ import annotations

import functools
import heapq
import time

import torch
from torch import nn

from ember.engine.request import Sequence
from ember.engine.spec.hidden_states import HiddenStateProposer
from ember.engine.spec.medusa_heads import MedusaHeads
from ember.layers.rejection_sampler import DraftRow
from ember.layers.sampler import draw_proposals

RANK_PRIOR = (0.5, 0.2, 0.1, 0.06, 0.04)  # chance that a head's r-th likeliest token is the target's (r = 0, 1, ...)


class MedusaProposer(HiddenStateProposer):
    """Drafts from the target's last hidden state with trained Medusa heads over the target's LM head (one more
    head's cost: its share of the one LM head product)."""

    def __init__(self, heads: MedusaHeads, target: nn.Module, generator: torch.Generator, tree_nodes: int = 0) -> None:
        """`tree_nodes` > 0: greedy rows draft trees of that many candidates (the runner must verify trees)."""
        super().__init__()
        self.heads = heads
        self.target = target
        self.tree_nodes = tree_nodes
        self._generator = generator
        self.cost.calibrate(self._time_heads, heads.num_heads)

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        newest = {seq: last for seq in wanted if (last := self.hidden.current(seq)) is not None}
        ready = {seq: min(wanted[seq], self.heads.num_heads) for seq in newest}
        if not ready:
            return {}
        started = time.perf_counter()
        hidden = torch.stack([last.hidden for last in newest.values()])
        num_heads = max(ready.values())
        with torch.inference_mode():
            logits = self.heads.logits(self.target, hidden, num_heads).float()
        drafts = {seq.seq_id: self._draft(logits[row, :k], seq) for row, (seq, k) in enumerate(ready.items())}
        self.cost.record(time.perf_counter() - started, num_heads)
        return drafts

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        """A greedy row's tree scores more positions than its depth."""
        if self.tree_nodes and seq.params.is_greedy:
            return len(rank_tree(min(num_drafts, self.heads.num_heads), self.tree_nodes))
        return num_drafts

    def _draft(self, logits: torch.Tensor, seq: Sequence) -> DraftRow:
        """Each head's token ([k, vocab] logits): a tree of their likeliest tokens or their argmax for greedy rows,
        a draw from each filtered distribution otherwise."""
        if self.tree_nodes and seq.params.is_greedy:
            paths = rank_tree(logits.shape[0], self.tree_nodes)
            ranked = logits.topk(min(len(RANK_PRIOR), logits.shape[1]), dim=-1).indices.tolist()
            index = {path: i for i, path in enumerate(paths)}
            return DraftRow(
                [ranked[len(path) - 1][path[-1]] for path in paths], parents=[index.get(path[:-1], -1) for path in paths]
            )
        return DraftRow(*draw_proposals(logits, seq.params, seq.generator or self._generator))

    def _time_heads(self) -> None:
        """One head product for one sequence (what calibration times)."""
        dtype = next(self.target.parameters()).dtype
        with torch.inference_mode():
            self.heads.logits(self.target, torch.zeros(1, self.heads.identity.hidden_size, dtype=dtype))


@functools.cache
def rank_tree(depth: int, num_nodes: int) -> tuple[tuple[int, ...], ...]:
    """The `num_nodes` likeliest rank paths of at most `depth` heads under `RANK_PRIOR`, each after its parent
    (computed once per shape: every drafting step and the cost model ask for it).

    A path's likelihood is the product of its ranks' priors, so a child is never likelier than its
    parent: taking paths best first from a frontier of children gives parents before children.
    """
    frontier = [(-RANK_PRIOR[r], (r,)) for r in range(len(RANK_PRIOR))]
    heapq.heapify(frontier)
    paths: list[tuple[int, ...]] = []
    while frontier and len(paths) < num_nodes:
        negative_likelihood, path = heapq.heappop(frontier)
        paths.append(path)
        if len(path) < depth:
            for r, prior in enumerate(RANK_PRIOR):
                heapq.heappush(frontier, (negative_likelihood * prior, (*path, r)))
    return tuple(paths)
