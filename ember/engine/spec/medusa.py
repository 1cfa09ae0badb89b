"""Medusa proposer: the heads read the target's last hidden state and draft a chain of K tokens at once.

After each step the runner hands over, per sequence, the target's final hidden state at the
position that drew the sequence's newest token (`LastHidden`). Head k turns it into a guess
for the token k + 1 places after that newest token; the K guesses form the draft (a chain: the
top-1 of each head, a degenerate Medusa tree). Drafting costs no target forward: one product of
the K heads' outputs with the LM head, for every drafting sequence together.

Greedy rows draft each head's argmax. Sampling rows draw each head's token from the head's
distribution after the row's own temperature, top-k, top-p and min-p (`filtered_probs`, as the
target's p is filtered) and hand that q to the rejection sampler, which keeps the output the
target's. The heads do not see earlier drafts, so q_k does not depend on them: still a valid
proposal for the rejection rule.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from ember.engine.request import Sequence
from ember.engine.runner import LastHidden
from ember.engine.spec.medusa_heads import MedusaHeads
from ember.layers.rejection_sampler import DraftRow
from ember.layers.sampler import draw_proposals

COST_SMOOTHING = 0.2  # weight of the newest drafting in the running cost estimate
CALIBRATION_ROUNDS = 3  # timed head products at start (the first warms up)


class MedusaProposer:
    """Drafts from the target's last hidden state with trained Medusa heads over the target's LM head."""

    uses_last_hidden = True

    def __init__(self, heads: MedusaHeads, target: nn.Module, generator: torch.Generator) -> None:
        self.heads = heads
        self.target = target
        self._generator = generator
        self._last_hidden: dict[str, LastHidden] = {}
        self._position_cost_s: float | None = None
        self._calibrate()

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        """Keep the newest hidden state of each sequence the step sampled for."""
        self._last_hidden.update(last_hidden)

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        ready = {seq: min(k, self.heads.num_heads) for seq, k in wanted.items() if self._current(seq) is not None}
        if not ready:
            return {}
        started = time.perf_counter()
        hidden = torch.stack([self._last_hidden[seq.seq_id].hidden for seq in ready])
        num_heads = max(ready.values())
        with torch.inference_mode():
            logits = self.heads.logits(self.target, hidden, num_heads).float()
        drafts = {seq.seq_id: self._draft(logits[row, :k], seq) for row, (seq, k) in enumerate(ready.items())}
        self._record(time.perf_counter() - started, num_heads)
        return drafts

    def draft_token_cost_s(self) -> float | None:
        """Seconds one more head costs a drafting (the heads share one LM head product, so this is its share)."""
        return self._position_cost_s

    def catch_up_cost_s(self, seq: Sequence) -> float:
        """Nothing to catch up on: the heads read the hidden state the target's own step left behind."""
        return 0.0

    def retain(self, seq_ids: set[str]) -> None:
        """Forget the hidden states of sequences that are no longer running."""
        for seq_id in set(self._last_hidden) - seq_ids:
            del self._last_hidden[seq_id]

    def _current(self, seq: Sequence) -> LastHidden | None:
        """The sequence's hidden state if it belongs to its newest token (not one from before a rollback or preemption)."""
        last = self._last_hidden.get(seq.seq_id)
        if last is None or last.position + 1 != seq.num_computed_tokens:
            return None
        return last

    def _draft(self, logits: torch.Tensor, seq: Sequence) -> DraftRow:
        """Each head's token ([k, vocab] logits): its argmax for greedy rows, a draw from its filtered distribution otherwise."""
        return DraftRow(*draw_proposals(logits, seq.params, seq.generator or self._generator))

    def _record(self, seconds: float, num_heads: int) -> None:
        per_head = seconds / num_heads
        self._position_cost_s = per_head if self._position_cost_s is None else (
            (1 - COST_SMOOTHING) * self._position_cost_s + COST_SMOOTHING * per_head
        )

    def _calibrate(self) -> None:
        """Time the heads and the LM head product for one sequence, so the first request is judged on a measured cost."""
        dtype = next(self.target.parameters()).dtype
        hidden = torch.zeros(1, self.heads.identity.hidden_size, dtype=dtype)
        for _ in range(CALIBRATION_ROUNDS):
            started = time.perf_counter()
            with torch.inference_mode():
                self.heads.logits(self.target, hidden)
            self._position_cost_s = None
            self._record(time.perf_counter() - started, self.heads.num_heads)
