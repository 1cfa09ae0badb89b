"""Who drafts, how many tokens, and what it paid: the engine's one handle on speculative decoding.

Each step the speculator picks the decoding sequences that may speculate, gives each a draft
length, asks the proposer, and afterwards records how many drafts the target kept.

Adaptive draft length. With per-token acceptance a, K drafts yield (1 - a^(K+1)) / (1 - a)
tokens per step, and cost 1 + n(K) * c steps' worth of time (n(K) = K scored positions, more for a tree), where c is what one more scored
(and, for a draft model, drafted) token costs relative to a step. The speculator estimates a per
sequence (discounted counts of kept vs tried drafts) and c from the decode steps it has seen (a linear
fit of step time against scheduled tokens, plus what the proposer says a drafted position costs),
then picks the K that gives most tokens per unit time. A new sequence's estimate starts from the
engine's pooled acceptance (every sequence's verifications, discounted alike; 3 of 4 before any):
a self-draft keeping 98% of its drafts, judged at a fixed 3 of 4, did not pay for a long prompt's
catch-up and never drafted. When no K > 0 pays, the sequence stops
drafting and probes with one draft token after `PROBE_INTERVAL` steps, so a change in the text can
bring it back. A draft model first has to catch up on the tokens it has not seen (the whole
prompt for a new sequence, the tokens decoded while it did not draft): a sequence drafts or
probes only when the time speculation should save over its remaining tokens covers that catch-up
with a margin (a probe counts on the prior's acceptance, not on every draft being kept). A proposer whose drafting has a price (a draft model, Medusa heads over the LM head)
doubles the wait after each probe that does not bring drafting back, up to `MAX_PROBE_INTERVAL`
steps with a catch-up and `MAX_PRICED_PROBE_INTERVAL` without (on text the proposer does not suit,
Medusa heads at 4% acceptance, probing every 16 steps cost a few percent); a free lookup (n-gram)
keeps probing every `PROBE_INTERVAL` steps.
Seeded sampled requests always draft the full K: their output then depends only on their own
tokens and seed (as long as the pool has room for the drafts), not on timings or neighbours.

Weight passes. GGML blocks at decode sizes run as GEMV passes of `rows_per_pass` rows (8): each pass
streams the whole weight, so a step's time is a staircase in its rows, not the line the fit assumes
(Qwen2.5-Coder-1.5B in 4-bit blocks at batch 1: n-gram at K=8, 9 rows a step, measured 2.19x where
K=4 gave 2.48x, though each step kept 7.2 tokens instead of 4.6). Drafts therefore fill the rows the
batch's last pass has spare and never start another (seeded sampled requests excepted, as above).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ember.engine.config import SpeculativeConfig
from ember.engine.request import Sequence, SequenceStatus
from ember.engine.runner import LastHidden
from ember.layers.rejection_sampler import DraftRow

PROBE_INTERVAL = 16
PRIOR_KEPT, PRIOR_TRIED = 3.0, 4.0  # a new sequence's acceptance: 3 of 4 drafts kept
MAX_PROBE_INTERVAL = 256
MAX_PRICED_PROBE_INTERVAL = 64  # priced drafting without a catch-up comes back sooner when the text changes
MIN_GAIN = 1.05  # expected speed-up below which a sequence does not draft
DISCOUNT = 0.9  # weight of older verifications in a sequence's acceptance estimate
CATCH_UP_MARGIN = 2.0  # a catch-up must be this many times cheaper than what drafting should save after it
DEFAULT_EXTRA_TOKEN_COST = 0.05  # relative cost of one more scored token until steps have been timed


class Proposer(Protocol):
    """Drafts tokens for sequences: `wanted` maps each sequence to the most tokens it may draft.

    `uses_last_hidden`: the proposer drafts from the target's hidden states (Medusa), so the runner
    keeps them and the engine hands them to `observe` after each step; others never pay for them.
    """

    uses_last_hidden: bool

    def observe(self, last_hidden: dict[str, LastHidden]) -> None: ...

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]: ...

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        """Positions the target scores when `seq` drafts `num_drafts` deep (more than that for a tree)."""
        ...

    def draft_token_cost_s(self) -> float | None:
        """Seconds one more drafted position costs the whole drafting batch; None when negligible."""
        ...

    def catch_up_cost_s(self, seq: Sequence) -> float:
        """Seconds the proposer must spend on `seq`'s unseen tokens before it can draft for it."""
        ...

    def retain(self, seq_ids: set[str]) -> None: ...


@dataclass
class SpeculationStats:
    """Counters of drafting and verification since the engine started."""

    draft_tokens: int = 0
    accepted_tokens: int = 0
    verifications: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    accepted_histogram: list[int] = field(default_factory=list)  # [j] = verifications that kept j drafts


@dataclass
class Acceptance:
    """Discounted counts of drafts kept and drafts tried by one sequence, and its probe clock."""

    kept: float = PRIOR_KEPT
    tried: float = PRIOR_TRIED
    steps_off: int = 0
    probe_interval: int = PROBE_INTERVAL

    @property
    def rate(self) -> float:
        return self.kept / self.tried

    def record(self, num_drafted: int, num_accepted: int) -> None:
        # A verification is a run of kept drafts ended by one rejection (unless all were kept).
        self.kept = DISCOUNT * self.kept + num_accepted
        self.tried = DISCOUNT * self.tried + num_accepted + (1 if num_accepted < num_drafted else 0)


@dataclass
class StepTimeFit:
    """Exponentially weighted least squares of step time against scheduled tokens: time = base + per_token * n.

    `min_weight`: how many (discounted) timings it needs before it trusts a slope."""

    min_weight: float = 4.0
    weight: float = 0.0
    n: float = 0.0
    t: float = 0.0
    nn: float = 0.0
    nt: float = 0.0

    def add(self, num_tokens: int, duration_s: float, decay: float = 0.98) -> None:
        self.weight = decay * self.weight + 1
        self.n = decay * self.n + num_tokens
        self.t = decay * self.t + duration_s
        self.nn = decay * self.nn + num_tokens * num_tokens
        self.nt = decay * self.nt + num_tokens * duration_s

    def per_token_s(self) -> float | None:
        if self.weight < self.min_weight:
            return None
        mean_n, mean_t = self.n / self.weight, self.t / self.weight
        variance = self.nn / self.weight - mean_n**2
        if variance < 0.25:
            return None  # every step had the same size: the slope is unknown
        return max(0.0, (self.nt / self.weight - mean_n * mean_t) / variance)

    def predict_s(self, num_tokens: int) -> float | None:
        """Expected step time; while the slope is unknown, the mean step time if steps had this size, else None."""
        if self.weight == 0:
            return None
        mean_n, mean_t = self.n / self.weight, self.t / self.weight
        per_token = self.per_token_s()
        if per_token is None:
            return mean_t if abs(mean_n - num_tokens) < 0.5 else None
        return mean_t + per_token * (num_tokens - mean_n)


class Speculator:
    """Chooses draft lengths, runs the proposer, and keeps the statistics of what it bought."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, rows_per_pass: int | None = None) -> None:
        """`rows_per_pass`: the rows one pass over the target's weights computes where its products run in passes
        (GGML blocks); None where a step's time grows smoothly with its rows."""
        self.config = config
        self.proposer = proposer
        self.rows_per_pass = rows_per_pass
        self.stats = SpeculationStats(accepted_histogram=[0] * (config.num_speculative_tokens + 1))
        self._acceptance: dict[str, Acceptance] = {}
        self._pooled = Acceptance()  # every sequence's verifications: what a new sequence can expect
        self._step_fit = StepTimeFit()

    def propose(self, running: list[Sequence]) -> dict[str, DraftRow]:
        """Drafts for this step, by sequence id, for the running sequences that decode and may speculate."""
        spare = self._spare_rows(len(running))
        wanted = {seq: k for seq in running if (k := self._draft_length(seq, len(running), spare)) > 0}
        if not wanted:
            return {}
        started = time.perf_counter()
        drafts = self.proposer.propose(wanted)
        self.stats.draft_time_s += time.perf_counter() - started
        return drafts

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        """Hand the proposer the hidden states of a step (only a proposer that `uses_last_hidden` gets any)."""
        if last_hidden:
            self.proposer.observe(last_hidden)

    def retain(self, running: list[Sequence]) -> None:
        """Drop the state (draft KV, n-gram indexes, acceptance) of sequences no longer running."""
        live = {seq.seq_id for seq in running}
        self.proposer.retain(live)
        for seq_id in set(self._acceptance) - live:
            del self._acceptance[seq_id]

    def observe_step(self, num_scheduled_tokens: int, num_draft_tokens: int, duration_s: float, decode_shaped: bool) -> None:
        """Time of one target step (drafted tokens included); `decode_shaped`: every sequence in it computed one
        token and its drafts (no prompt chunk).

        Only decode-shaped steps feed the cost estimate: a prompt chunk's tokens go through the batched
        products at a cost per token of their own (above a verified row's in float32, below it where GGML
        blocks are dequantized for prefill), which would misprice the verified rows drafts add.
        """
        if decode_shaped:
            self._step_fit.add(num_scheduled_tokens, duration_s)
        if num_draft_tokens:
            self.stats.verify_time_s += duration_s

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """What verification kept of one sequence's drafts (`num_drafted`: their depth, the most it could keep)."""
        self.stats.draft_tokens += num_drafted
        self.stats.accepted_tokens += num_accepted
        self.stats.verifications += 1
        self.stats.accepted_histogram[num_accepted] += 1
        self._sequence_acceptance(seq).record(num_drafted, num_accepted)
        self._pooled.record(num_drafted, num_accepted)

    def _sequence_acceptance(self, seq: Sequence) -> Acceptance:
        """`seq`'s acceptance estimate; a new one starts at the pooled rate, as strong a prior as the fixed one."""
        acceptance = self._acceptance.get(seq.seq_id)
        if acceptance is None:
            acceptance = self._acceptance[seq.seq_id] = Acceptance(kept=PRIOR_TRIED * self._pooled.rate, tried=PRIOR_TRIED)
        return acceptance

    def _spare_rows(self, batch_size: int) -> int | None:
        """Draft rows each of `batch_size` sequences may add without another pass over the weights (None: no passes)."""
        if self.rows_per_pass is None or batch_size == 0:
            return None
        passes = -(-batch_size // self.rows_per_pass)
        return (passes * self.rows_per_pass - batch_size) // batch_size

    def _draft_length(self, seq: Sequence, batch_size: int, spare_rows: int | None = None) -> int:
        if not self._may_speculate(seq):
            return 0
        params = seq.params
        room = (params.max_tokens or 1 << 30) - seq.num_output_tokens - 1  # the token after the drafts counts too
        k_max = min(self.config.num_speculative_tokens, room)
        if k_max <= 0:
            return 0
        if not self.config.adaptive or (params.seed is not None and not params.is_greedy):
            # A seeded sample depends on its drafts; a draft length that followed measured step
            # times would make it depend on what shares the batch.
            return k_max
        if spare_rows is not None:
            k_max = self._deepest_fitting(seq, k_max, spare_rows)
            if k_max == 0:
                return 0
        acceptance = self._sequence_acceptance(seq)
        cost = self.extra_token_cost(batch_size)
        if cost is None:
            return 0  # drafting has a price and the target's step time is not known yet
        k = best_draft_length(acceptance.rate, cost, k_max, lambda depth: self.proposer.scored_tokens(seq, depth))
        if k > 0 and self._catch_up_pays(seq, acceptance.rate, cost, k, batch_size):
            acceptance.steps_off = 0
            acceptance.probe_interval = PROBE_INTERVAL
            return k
        acceptance.steps_off += 1
        if acceptance.steps_off < acceptance.probe_interval:
            return 0
        acceptance.steps_off = 0
        acceptance.probe_interval = min(2 * acceptance.probe_interval, self._longest_probe_interval(seq))
        # A probe asks whether the text has become draftable again. Its catch-up is worth paying only if drafting at a
        # typical acceptance (the prior's) would pay it back: at 100% nearly any draft model looks worth it, and one
        # about as costly per token as the target's own step then lost time on every probe.
        return 1 if self._catch_up_pays(seq, PRIOR_KEPT / PRIOR_TRIED, cost, k_max, batch_size) else 0

    def _deepest_fitting(self, seq: Sequence, k_max: int, rows: int) -> int:
        """The deepest draft up to `k_max` whose scored positions fit in `rows` (0 if none does)."""
        return next((k for k in range(k_max, 0, -1) if self.proposer.scored_tokens(seq, k) <= rows), 0)

    def _longest_probe_interval(self, seq: Sequence) -> int:
        """How far failed probes may push the next one: as far as a probe's drafting costs."""
        if self.proposer.catch_up_cost_s(seq) > 0:
            return MAX_PROBE_INTERVAL
        if self.proposer.draft_token_cost_s() is not None:
            return MAX_PRICED_PROBE_INTERVAL
        return PROBE_INTERVAL

    def _catch_up_pays(self, seq: Sequence, acceptance_rate: float, cost: float, k: int, batch_size: int) -> bool:
        """Whether drafting K for the rest of `seq` should save more time than the proposer's catch-up costs."""
        catch_up_s = self.proposer.catch_up_cost_s(seq)
        if catch_up_s <= 0:
            return True
        step_s = self._step_fit.predict_s(batch_size)
        max_tokens = seq.params.max_tokens
        if step_s is None or max_tokens is None:
            return True
        gain = expected_tokens(acceptance_rate, k) / (1 + k * cost)
        saved_s = (max_tokens - seq.num_output_tokens) * step_s * (1 - 1 / gain)
        return saved_s >= CATCH_UP_MARGIN * catch_up_s  # the margin covers the gain model's optimism

    def extra_token_cost(self, batch_size: int) -> float | None:
        """What one more drafted token of one sequence costs, relative to the time a step gives each sequence.

        None when the proposer's drafts have a price but the target's step time is still unknown.
        """
        draft_s = self.proposer.draft_token_cost_s()
        step = self._step_fit.predict_s(batch_size)
        if step is None or step <= 0:
            return DEFAULT_EXTRA_TOKEN_COST if draft_s is None else None
        per_token = self._step_fit.per_token_s()
        scored = DEFAULT_EXTRA_TOKEN_COST if per_token is None else per_token * batch_size / step
        drafted = 0.0 if draft_s is None else draft_s / step  # a draft forward serves the whole batch
        return scored + drafted

    @staticmethod
    def _may_speculate(seq: Sequence) -> bool:
        params = seq.params
        return (
            seq.status is SequenceStatus.RUNNING
            and params.allow_speculation
            and not seq.fork_pending
            and seq.num_uncomputed_tokens == 1
            and not params.has_penalties  # penalties would need each drafted position's own history
            # verification compares the proposers' and the target's unbiased, unmasked logits (bad words also change
            # with each drafted token)
            and not params.restricts_tokens
            # (a constraint is applied to the target's logits at every drafted position, JsonGuide.hold_drafts: the
            # logprobs verification reports would be the held ones, so a constrained request asking for them does not draft)
            and (params.structured_output is None or params.logprobs is None)
            and seq.num_output_tokens >= params.min_tokens  # banned stop tokens change inside the drafts
        )


def expected_tokens(acceptance_rate: float, num_drafts: int) -> float:
    """Tokens one verification yields on average: kept drafts plus the one drawn after them."""
    a = min(acceptance_rate, 0.999)
    return (1 - a ** (num_drafts + 1)) / (1 - a)


def best_draft_length(
    acceptance_rate: float, extra_token_cost: float, k_max: int, scored: Callable[[int], int] = lambda k: k
) -> int:
    """The K in 0..k_max with the most expected tokens per unit of step time; 0 unless it gains `MIN_GAIN`.

    `scored(K)`: the positions a draft K deep makes the target score (a tree scores more than K).
    The margin covers what the estimates miss (their noise, the proposer's own bookkeeping).
    """
    def gain(k: int) -> float:
        return expected_tokens(acceptance_rate, k) / (1 + (scored(k) if k else 0) * extra_token_cost)

    best = max(range(k_max + 1), key=gain)
    return best if gain(best) >= MIN_GAIN else 0
