"""What proposers that draft from the target's hidden states (Medusa heads, the EAGLE-style head) share: each
sequence's newest hidden state kept between steps, the measured cost of their drafting, and the parts of the
proposer protocol that follow from those two."""

from __future__ import annotations

import time
from collections.abc import Callable

from ember.engine.request import Sequence
from ember.engine.runner import LastHidden

COST_SMOOTHING = 0.2  # weight of the newest drafting in the running cost estimate
CALIBRATION_ROUNDS = 3  # timed draftings at start (the first warms up)


class NewestHiddenStates:
    """The target's hidden state behind each running sequence's newest token, as the engine hands them over."""

    def __init__(self) -> None:
        self._states: dict[str, LastHidden] = {}

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        """Keep the newest hidden state of each sequence the step sampled for."""
        self._states.update(last_hidden)

    def current(self, seq: Sequence) -> LastHidden | None:
        """The sequence's hidden state if it belongs to its newest token (not one from before a rollback or preemption)."""
        last = self._states.get(seq.seq_id)
        if last is None or last.position + 1 != seq.num_computed_tokens:
            return None
        return last

    def retain(self, seq_ids: set[str]) -> None:
        """Forget the hidden states of sequences that are no longer running."""
        for seq_id in set(self._states) - seq_ids:
            del self._states[seq_id]


class DraftingCost:
    """Seconds one drafted position costs a drafting batch, smoothed over the draftings timed so far."""

    def __init__(self) -> None:
        self.per_position_s: float | None = None

    def record(self, seconds: float, num_positions: int) -> None:
        per_position = seconds / num_positions
        self.per_position_s = per_position if self.per_position_s is None else (
            (1 - COST_SMOOTHING) * self.per_position_s + COST_SMOOTHING * per_position
        )

    def calibrate(self, drafting: Callable[[], None], num_positions: int) -> None:
        """Time `drafting` (of `num_positions` positions) a few times and keep the last, warmed-up timing."""
        for _ in range(CALIBRATION_ROUNDS):
            started = time.perf_counter()
            drafting()
            self.per_position_s = None
            self.record(time.perf_counter() - started, num_positions)


class HiddenStateProposer:
    """The proposer protocol's bookkeeping for a proposer that drafts from the target's newest hidden states.

    Drafting is priced (`cost`, measured), but there is nothing to catch up on: the hidden state comes
    from the target's own step. Subclasses give `propose`; `scored_tokens` is a chain's unless overridden.
    """

    uses_last_hidden = True

    def __init__(self) -> None:
        self.hidden = NewestHiddenStates()
        self.cost = DraftingCost()

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        self.hidden.observe(last_hidden)

    def retain(self, seq_ids: set[str]) -> None:
        self.hidden.retain(seq_ids)

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        """A chain: one scored position per drafted token."""
        return num_drafts

    def draft_token_cost_s(self) -> float | None:
        """Seconds one more drafted position costs a drafting batch, as measured."""
        return self.cost.per_position_s

    def catch_up_cost_s(self, seq: Sequence) -> float:
        """Nothing to catch up on: the hidden state is the one the target's own step left behind."""
        return 0.0
