"""EAGLE-style proposer: the head extrapolates the target's final hidden state one token at a time.

After each step the runner hands over, per sequence, the target's hidden state f_p behind the
sequence's newest token x_(p+1) (`LastHidden`). Draft step i feeds (f, embedding of x) to the
head, which gives the next feature; its product with the draft vocabulary's LM-head rows gives
the next token, which with that feature feeds step i + 1. Every drafting sequence runs each step
together (one batch), so a drafting of K tokens costs K small head passes and K draft-vocabulary
products, whatever the batch.

Greedy rows draft the argmax; sampling rows draw from the step's distribution over the draft
vocabulary after the row's own temperature, top-k, top-p and min-p, and hand that q (zero outside
the draft vocabulary) to the rejection sampler, which keeps the output the target's.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from ember.engine.request import Sequence
from ember.engine.spec.eagle_head import EagleHead, token_embeddings
from ember.engine.spec.hidden_states import HiddenStateProposer
from ember.engine.spec.lm_head_rows import lm_head_rows
from ember.layers.rejection_sampler import DraftRow
from ember.layers.sampler import draw_proposals, row_argmax


class EagleProposer(HiddenStateProposer):
    """Drafts autoregressively at the feature level with a trained EAGLE-style head (a draft step's cost: a head
    pass and a draft-vocabulary product)."""

    def __init__(self, head: EagleHead, target: nn.Module, generator: torch.Generator) -> None:
        super().__init__()
        self.head = head
        self.target = target
        self._generator = generator
        self._lm_rows = lm_head_rows(target, head.vocab_ids)  # [N, hidden] float32
        self.cost.calibrate(lambda: self._draft_step(torch.zeros(1, head.identity.hidden_size), torch.zeros(1, dtype=torch.long)), 1)

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        newest = {seq: last for seq in wanted if (last := self.hidden.current(seq)) is not None}
        if not newest:
            return {}
        started = time.perf_counter()
        seqs = list(newest)
        feature = torch.stack([last.hidden.float() for last in newest.values()])
        tokens = torch.tensor([seq.token_ids[last.position + 1] for seq, last in newest.items()])
        drafted: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        num_steps = max(wanted[seq] for seq in seqs)
        for _ in range(num_steps):
            feature, logits = self._draft_step(feature, tokens)
            argmax = self.head.vocab_ids[row_argmax(logits)].tolist()  # every greedy row's draft in one call
            for row, seq in enumerate(seqs):
                if seq.params.is_greedy:
                    drafted[row].append(argmax[row])
                    continue
                (index,), q = draw_proposals(logits[row : row + 1], seq.params, seq.generator or self._generator)
                drafted[row].append(int(self.head.vocab_ids[index]))
                probs[row].append(self._full_vocabulary(q[0]))
            tokens = torch.tensor([row[-1] for row in drafted])
        self.cost.record(time.perf_counter() - started, num_steps)
        return {
            seq.seq_id: DraftRow(drafted[row][: wanted[seq]], torch.stack(probs[row][: wanted[seq]]) if probs[row] else None)
            for row, seq in enumerate(seqs)
        }

    def _draft_step(self, feature: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The next features [B, hidden] and their logits over the draft vocabulary [B, N]."""
        with torch.inference_mode():
            feature = self.head(feature, token_embeddings(self.target, tokens)).float()
            return feature, feature @ self._lm_rows.t()

    def _full_vocabulary(self, q: torch.Tensor) -> torch.Tensor:
        """A draft-vocabulary distribution spread over the target's vocabulary (zero elsewhere)."""
        full = torch.zeros(self.head.identity.vocab_size)
        full[self.head.vocab_ids] = q.float()
        return full
