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
from ember.engine.runner import LastHidden
from ember.engine.spec.eagle_head import EagleHead, draft_lm_rows, token_embeddings
from ember.engine.spec.hidden_states import DraftingCost, NewestHiddenStates
from ember.layers.rejection_sampler import DraftRow
from ember.layers.sampler import draw_proposals


class EagleProposer:
    """Drafts autoregressively at the feature level with a trained EAGLE-style head."""

    uses_last_hidden = True

    def __init__(self, head: EagleHead, target: nn.Module, generator: torch.Generator) -> None:
        self.head = head
        self.target = target
        self._generator = generator
        self._lm_rows = draft_lm_rows(target, head.vocab_ids)  # [N, hidden] float32
        self.hidden = NewestHiddenStates()
        self.cost = DraftingCost()
        self.cost.calibrate(lambda: self._draft_step(torch.zeros(1, head.identity.hidden_size), torch.zeros(1, dtype=torch.long)), 1)

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        self.hidden.observe(last_hidden)

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        ready = {seq: k for seq, k in wanted.items() if self.hidden.current(seq) is not None}
        if not ready:
            return {}
        started = time.perf_counter()
        seqs = list(ready)
        newest = [self.hidden.current(seq) for seq in seqs]
        feature = torch.stack([last.hidden.float() for last in newest])
        tokens = torch.tensor([seq.token_ids[last.position + 1] for seq, last in zip(seqs, newest, strict=True)])
        drafted: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        num_steps = max(ready.values())
        for _ in range(num_steps):
            feature, logits = self._draft_step(feature, tokens)
            for row, seq in enumerate(seqs):
                (index,), q = draw_proposals(logits[row : row + 1], seq.params, seq.generator or self._generator)
                drafted[row].append(int(self.head.vocab_ids[index]))
                if q is not None:
                    probs[row].append(self._full_vocabulary(q[0]))
            tokens = torch.tensor([row[-1] for row in drafted])
        self.cost.record(time.perf_counter() - started, num_steps)
        return {
            seq.seq_id: DraftRow(drafted[row][:k], torch.stack(probs[row][:k]) if probs[row] else None)
            for row, (seq, k) in enumerate(ready.items())
        }

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        """A chain: one scored position per drafted token."""
        return num_drafts

    def draft_token_cost_s(self) -> float | None:
        """Seconds one draft step costs the drafting batch (a head pass and a draft-vocabulary product)."""
        return self.cost.per_position_s

    def catch_up_cost_s(self, seq: Sequence) -> float:
        """Nothing to catch up on: the head reads the hidden state the target's own step left behind."""
        return 0.0

    def retain(self, seq_ids: set[str]) -> None:
        self.hidden.retain(seq_ids)

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
