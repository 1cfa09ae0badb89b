"""The scheduler: each step, who runs and how many tokens each gets, within one token budget."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ember.engine.config import SchedulerConfig
from ember.engine.request import Sequence, SequenceStatus
from ember.kv.cache_manager import BlockCopy, CachedPrefix, KVCacheManager
from ember.layers.rejection_sampler import DraftRow


@dataclass
class ScheduledSequence:
    """A sequence in this step's batch, how many of its tokens are computed, and where its KV lives.

    `block_ids` holds, per layer group, the sequence's block ids once this step's slots are allocated (the
    runner reads them here, never the cache manager's tables). With a `draft`, the last `num_draft_tokens`
    of the `num_new_tokens` are drafted tokens that the step scores after the sequence's own last token
    (speculative verification).
    """

    seq: Sequence
    num_new_tokens: int
    block_ids: tuple[list[int], ...]
    draft: DraftRow | None = None

    @property
    def num_draft_tokens(self) -> int:
        return 0 if self.draft is None else len(self.draft.token_ids)

    @property
    def samples(self) -> bool:
        return self.seq.samples_after(self.num_new_tokens - self.num_draft_tokens)

    @property
    def new_token_ids(self) -> list[int]:
        """The tokens this step computes: the sequence's uncomputed ones, then any drafted ones."""
        first = self.seq.num_computed_tokens
        own = self.seq.token_ids[first : first + self.num_new_tokens - self.num_draft_tokens]
        return own if self.draft is None else own + self.draft.token_ids


@dataclass
class SchedulerOutput:
    """One step's plan: the batch, the block copies to do first, who was preempted."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    block_copies: list[BlockCopy] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Continuous batching with chunked prefill, FCFS (or priority) admission, preemption by recompute."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_loras: int | None = None) -> None:
        """`max_loras`: at most that many distinct LoRA adapters among the running sequences (None: no adapters)."""
        self.config = config
        self.kv = kv
        self.max_loras = max_loras
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a new sequence by (priority, arrival)."""
        seq.status = SequenceStatus.WAITING
        key = _queue_key(seq)
        position = len(self.waiting)
        while position > 0 and _queue_key(self.waiting[position - 1]) > key:
            position -= 1
        self.waiting.insert(position, seq)

    def schedule(self, drafts: dict[str, DraftRow] | None = None) -> SchedulerOutput:
        """Plan one step; `drafts` are proposed tokens to verify, by sequence id.

        Every step guarantees:
        - at most `max_num_batched_tokens` tokens (drafted ones included) and `max_num_seqs`
          sequences are scheduled;
        - drafted tokens ride only on a decoding sequence, only where the budget and free blocks
          allow without preempting anyone; their slots are never registered in the prefix cache;
        - running sequences go first (decodes, then unfinished prefills, oldest first); when the
          pool has no block for one, the newest running sequence not yet in this step's batch (of the
          lowest priority, where priorities differ) is preempted by recompute: its blocks are freed and it
          goes back to the queue ahead of every sequence of its priority or lower, its output kept;
        - waiting sequences are admitted in queue order, only in steps without preemption, with
          prefix-cache hits counted as computed and long prompts cut to fit the budget, and only while the
          running sequences hold at most `max_loras` distinct adapters (each a slot of the adapter pool);
        - every sequence is in exactly one of waiting, running or finished: none lost, none twice.
        """
        out = SchedulerOutput()
        budget = self._schedule_running(self.config.max_num_batched_tokens, out, drafts or {})
        if not out.preempted:
            self._admit_waiting(budget, out)
        return out

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Start `children` sharing every KV block of `parent`, right behind it in the running order."""
        position = self.running.index(parent) + 1
        for child in children:
            child.num_computed_tokens = parent.num_computed_tokens
            child.status = SequenceStatus.RUNNING
            self.kv.fork(parent.seq_id, child.seq_id)
        self.running[position:position] = children

    def finish(self, seq: Sequence) -> None:
        """Take a finished (or aborted) sequence out of its queue and give back its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self._free(seq)

    def roll_back(self, seq: Sequence) -> None:
        """Give back the blocks past `seq`'s computed tokens (slots of rejected drafted tokens)."""
        self.kv.trim(seq.seq_id, seq.num_computed_tokens)

    def _schedule_running(self, budget: int, out: SchedulerOutput, drafts: dict[str, DraftRow]) -> int:
        # Decodes first keep inter-token latency low while long prompts are chunked in.
        order = sorted(self.running, key=lambda s: s.num_uncomputed_tokens > 1)
        for seq in order:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            draft = drafts.get(seq.seq_id)
            if draft is not None and self._schedule_draft(seq, draft, budget, out):
                budget -= out.scheduled[-1].num_new_tokens
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            copies = self._allocate_or_preempt(seq, num_new, out)
            if copies is None:
                continue
            out.scheduled.append(ScheduledSequence(seq, num_new, self.kv.block_ids(seq.seq_id)))
            out.block_copies.extend(copies)
            budget -= num_new
        return budget

    def _schedule_draft(self, seq: Sequence, draft: DraftRow, budget: int, out: SchedulerOutput) -> bool:
        """Schedule `seq`'s last token plus as much of `draft` as fits; False (nothing changed) if none does.

        Drafted tokens are a bet, so they never preempt: they take blocks only while at least
        one free block per running sequence remains for the tokens that are sure to be kept.
        """
        num_draft = min(len(draft.token_ids), budget - 1)
        if seq.num_uncomputed_tokens != 1 or num_draft < 1:
            return False
        if self.kv.num_free_blocks < len(self.running) + -(-num_draft // self.kv.block_size):
            return False
        copies = self.kv.allocate_slots(seq.seq_id, seq.token_ids, seq.num_computed_tokens, 1 + num_draft,
                                        extra_keys=seq.request.cache_keys)
        if copies is None:
            return False
        out.scheduled.append(ScheduledSequence(seq, 1 + num_draft, self.kv.block_ids(seq.seq_id), draft.truncated(num_draft)))
        out.block_copies.extend(copies)
        return True

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> list[BlockCopy] | None:
        """Blocks for `seq`, preempting the newest running sequences until they fit; None if `seq` itself went."""
        while True:
            copies = self.kv.allocate_slots(seq.seq_id, seq.token_ids, seq.num_computed_tokens, num_new,
                                            extra_keys=seq.request.cache_keys)
            if copies is not None:
                return copies
            # Never a sequence already in this step's batch: its blocks are promised to the step. The lowest
            # priority (largest value) goes first, the newest running of those (all of them with equal priorities).
            scheduled = {id(item.seq) for item in out.scheduled}
            candidates = [(s.request.priority, i) for i, s in enumerate(self.running) if id(s) not in scheduled]
            victim = self.running[max(candidates)[1]]
            self._preempt(victim, out)
            if victim is seq:
                return None

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        # Back in the queue ahead of every waiting sequence of its priority or lower (all of them when equal).
        priority = seq.request.priority
        position = next((i for i, waiting in enumerate(self.waiting) if waiting.request.priority >= priority), len(self.waiting))
        self.waiting.insert(position, seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def _free(self, seq: Sequence) -> None:
        """Give back `seq`'s blocks; the tokens they hold stay findable in the prefix cache."""
        self.kv.free(seq.seq_id, seq.token_ids[: seq.num_computed_tokens], seq.request.cache_keys)

    def _admit_waiting(self, budget: int, out: SchedulerOutput) -> None:
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            # A running sequence about to fork will need a seat for each sibling too.
            seats_taken = sum(_seats_needed(s) for s in self.running)
            if seats_taken + _seats_needed(seq) > self.config.max_num_seqs or not self._adapter_fits(seq):
                break
            prefix = self._cached_prefix(seq)
            num_uncomputed = seq.compute_target - prefix.num_tokens
            num_new = min(num_uncomputed, budget)
            if num_new < num_uncomputed and not self.config.enable_chunked_prefill:
                break  # the whole prompt must fit in one step
            copies = self.kv.allocate_slots(seq.seq_id, seq.token_ids, prefix.num_tokens, num_new, prefix, seq.request.cache_keys)
            if copies is None:
                break
            seq.num_computed_tokens = prefix.num_tokens
            self.waiting.pop(0)
            self._record_admission(seq, prefix)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new, self.kv.block_ids(seq.seq_id)))
            out.block_copies.extend(copies)
            budget -= num_new

    def _adapter_fits(self, seq: Sequence) -> bool:
        """Whether `seq`'s adapter is already running or a slot is left for it (always, without an adapter)."""
        wanted = seq.request.asked.lora_request
        if wanted is None:
            return True
        running = {s.request.asked.lora_request.lora_int_id for s in self.running if s.request.asked.lora_request is not None}
        return wanted.lora_int_id in running or len(running) < (self.max_loras or 0)

    def _cached_prefix(self, seq: Sequence) -> CachedPrefix:
        # At least one token is always computed: its logits are what the step samples from.
        # A request asking for prompt logprobs needs every prompt position's logits, which a
        # cached prefix does not hold: it computes its whole prompt (its blocks still go into
        # the cache for later requests), as vLLM does.
        if seq.params.prompt_logprobs is not None:
            return CachedPrefix()
        return self.kv.find_cached_prefix(seq.token_ids, seq.compute_target - 1, seq.request.cache_keys)

    @staticmethod
    def _record_admission(seq: Sequence, prefix: CachedPrefix) -> None:
        request = seq.request
        if request.metrics.first_scheduled_time is None:
            request.metrics.first_scheduled_time = time.monotonic()
            request.num_cached_tokens = min(prefix.num_tokens, seq.num_prompt_tokens)


def _queue_key(seq: Sequence) -> tuple[int, int]:
    return (seq.request.priority, seq.request.arrival_index)


def _seats_needed(seq: Sequence) -> int:
    """A sequence about to fork needs seats for all its siblings."""
    return seq.params.n if seq.fork_pending else 1
