"""A small draft model with the target's tokenizer drafts K tokens one forward pass at a time.

The draft keeps its own paged KV cache (its own block pool and tables) and, per sequence, a
shadow `Sequence` holding the real tokens plus its own latest drafts. Before drafting, the
shadow is reconciled with the real sequence: KV is kept up to the first position where a draft
differs from what the target accepted, so rejected drafts are recomputed and accepted ones are
not. Then one forward catches the draft up on the new real tokens and yields the first draft
token, and K - 1 single-token forwards yield the rest, every drafting sequence batched together.

Two costs are measured, so the speculator can tell whether drafting pays: a drafted token costs
a decode-shaped forward (at most `DECODE_SHAPED_TOKENS` new tokens per sequence: after a
verification the draft catches up on one or two); a longer catch-up (the prompt, or the tokens
decoded while a sequence did not draft) costs a fixed part plus a part per token caught up, once,
before any draft (a line fitted to the catch-ups' times: per token, a 64-token catch-up of SmolLM2
in its 4-bit blocks measured 0.86 ms and a 376-token one 0.45, so one length's rate extrapolated
to a long prompt doubled its cost and kept a self-draft at 98% acceptance from ever drafting).
Both are timed on throwaway sequences when the proposer is built (catch-ups of two lengths), so
even the first request is judged on measured costs, and follow the real forwards afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ember.engine.engine_request import EngineRequest
from ember.engine.request import Request, Sequence
from ember.engine.runner import LastHidden, ModelRunner
from ember.engine.sampling_params import SamplingParams
from ember.engine.scheduler import ScheduledSequence, SchedulerOutput
from ember.engine.spec.speculator import StepTimeFit
from ember.kv.cache_manager import KVCacheManager
from ember.kv.tensors import kv_cache_layout
from ember.layers.rejection_sampler import DraftRow
from ember.layers.sampler import Sampler, draw_proposals

DECODE_SHAPED_TOKENS = 2  # new tokens per sequence after a verification kept every draft (the last draft and the bonus)
COST_SMOOTHING = 0.2  # weight of the newest forward in the running cost estimates
CALIBRATION_PROMPTS = (64, 256)  # catch-ups timed at start (a short model: a quarter of its length and all of it)
CALIBRATION_DRAFTS = 4  # decode-shaped forwards timed after it
CALIBRATION_FIT_WEIGHT = 1.5  # the catch-up line trusts the two calibration timings (their discounted weight: 1.98)


@dataclass
class DraftState:
    """The draft model's view of one sequence: its shadow and how many shadow tokens are real."""

    shadow: Sequence
    num_real: int


class DraftModelProposer:
    """Drafts with a second model over its own KV cache; q is the draft's filtered distribution."""

    uses_last_hidden = False

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        generator: torch.Generator,
        max_model_len: int,
        cache_dtype: torch.dtype | None = None,
    ) -> None:
        """`max_model_len`: the draft's longest sequence (bounds the calibration's); `cache_dtype` None: the draft's KV
        cache takes the draft model's dtype."""
        # A draft with sliding-window layers (Gemma 2/3) keeps one block table per layer group, as the target's cache does.
        self.kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False,
                                 group_windows=kv_cache_layout(model).group_windows)
        self.runner = ModelRunner(
            model, num_blocks, block_size, self.kv, Sampler(generator), frozenset(), cache_dtype=cache_dtype
        )
        self._generator = generator
        self._states: dict[str, DraftState] = {}
        self._forward_s: float | None = None
        self._catch_up_fit = StepTimeFit()  # seconds of a catch-up forward against the tokens it computes (set by _calibrate)
        self._calibrate(min(max_model_len, num_blocks * block_size) - CALIBRATION_DRAFTS - 1)

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        """A chain: one scored position per drafted token."""
        return num_drafts

    def draft_token_cost_s(self) -> float | None:
        """Seconds one more draft position costs the drafting batch (a decode-shaped forward)."""
        return self._forward_s

    def catch_up_cost_s(self, seq: Sequence) -> float:
        """Seconds the draft needs to catch up on `seq` before it can draft, beyond a drafting step's own forward."""
        state = self._states.get(seq.seq_id)
        valid = 0 if state is None else min(state.shadow.num_computed_tokens, state.num_real)
        pending = len(seq.token_ids) - valid
        if pending <= DECODE_SHAPED_TOKENS:
            return 0.0
        return self._catch_up_fit.predict_s(pending) or 0.0

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        active = {seq: k for seq, k in wanted.items() if self._catch_up(seq)}
        tokens: dict[str, list[int]] = {seq.seq_id: [] for seq in active}
        probs: dict[str, list[torch.Tensor]] = {seq.seq_id: [] for seq in active}
        for step in range(max(active.values(), default=0)):
            batch = [seq for seq, k in active.items() if k > step and self._allocate(seq)]
            if not batch:
                break
            self._draft_step(batch, tokens, probs)
        return {
            seq_id: DraftRow(ids, torch.stack(probs[seq_id]) if probs[seq_id] else None)
            for seq_id, ids in tokens.items()
            if ids
        }

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        """Not called: the draft model reads tokens only."""

    def retain(self, seq_ids: set[str]) -> None:
        """Free the draft KV of sequences that are no longer running."""
        for seq_id in set(self._states) - seq_ids:
            del self._states[seq_id]
            self.kv.free(seq_id)

    def _catch_up(self, seq: Sequence) -> bool:
        """Reconcile the shadow with the real tokens; keep KV only where every token so far is real."""
        state = self._states.get(seq.seq_id)
        if state is None:
            shadow = Sequence(seq.seq_id, seq.request, seq.index, list(seq.token_ids), seq.num_prompt_tokens)
            self._states[seq.seq_id] = DraftState(shadow, len(seq.token_ids))
            return True
        shadow, real = state.shadow, seq.token_ids
        match = state.num_real
        while match < min(len(shadow.token_ids), len(real)) and shadow.token_ids[match] == real[match]:
            match += 1
        del shadow.token_ids[match:]
        shadow.token_ids.extend(real[match:])
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, match)
        state.num_real = len(real)
        return True

    def _allocate(self, seq: Sequence) -> bool:
        shadow = self._states[seq.seq_id].shadow
        num_new = len(shadow.token_ids) - shadow.num_computed_tokens
        return self.kv.allocate_slots(shadow.seq_id, shadow.token_ids, shadow.num_computed_tokens, num_new) is not None

    def _draft_step(self, batch: list[Sequence], tokens: dict[str, list[int]], probs: dict[str, list[torch.Tensor]]) -> None:
        """One draft forward over `batch` (catch-up or one token each) and one drafted token per sequence."""
        shadows = [self._states[seq.seq_id].shadow for seq in batch]
        plan = SchedulerOutput([ScheduledSequence(s, len(s.token_ids) - s.num_computed_tokens, self.kv.block_ids(s.seq_id))
                                for s in shadows])
        started = time.perf_counter()
        logits = self.runner.last_position_logits(plan).float()
        self._record_forward(plan, time.perf_counter() - started)
        for row, (seq, shadow) in enumerate(zip(batch, shadows, strict=True)):
            shadow.num_computed_tokens = len(shadow.token_ids)
            token, q = self._sample(logits[row], seq)
            shadow.token_ids.append(token)
            tokens[seq.seq_id].append(token)
            if q is not None:
                probs[seq.seq_id].append(q)

    def _record_forward(self, plan: SchedulerOutput, seconds: float) -> None:
        if max(item.num_new_tokens for item in plan.scheduled) <= DECODE_SHAPED_TOKENS:
            self._forward_s = _smoothed(self._forward_s, seconds)
        else:
            self._catch_up_fit.add(plan.num_batched_tokens, seconds)

    def _calibrate(self, longest_prompt: int) -> None:
        """Time catch-ups of two lengths (the longest at most `longest_prompt`), which give the catch-up line its fixed part
        and its slope, and a few drafts after each, after one untimed round that warms the same shapes up."""
        short, long = CALIBRATION_PROMPTS
        lengths = sorted({max(1, min(short, longest_prompt // 4)), max(1, min(long, longest_prompt))})
        for _ in range(2):
            self._forward_s, self._catch_up_fit = None, StepTimeFit(min_weight=CALIBRATION_FIT_WEIGHT)
            for length in lengths:
                self._draft_throwaway(length)

    def _draft_throwaway(self, prompt_len: int) -> None:
        """Catch up on a throwaway prompt and draft after it (the forwards are timed as real ones), then forget it."""
        params = SamplingParams(temperature=0.0, max_tokens=CALIBRATION_DRAFTS)
        prompt = [0] * prompt_len
        seq = Sequence("draft-calibration", Request(EngineRequest("draft-calibration", prompt, params)), 0, list(prompt), len(prompt))
        self._catch_up(seq)
        tokens: dict[str, list[int]] = {seq.seq_id: []}
        for _ in range(1 + CALIBRATION_DRAFTS):
            if not self._allocate(seq):
                break
            self._draft_step([seq], tokens, {seq.seq_id: []})
        self.retain(set())

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> tuple[int, torch.Tensor | None]:
        """The draft's token and the distribution q it came from (None for greedy: only argmax agreement counts)."""
        tokens, q = draw_proposals(logits.unsqueeze(0), seq.params, seq.generator or self._generator)
        return tokens[0], None if q is None else q[0]


def _smoothed(old: float | None, new: float) -> float:
    return new if old is None else (1 - COST_SMOOTHING) * old + COST_SMOOTHING * new
