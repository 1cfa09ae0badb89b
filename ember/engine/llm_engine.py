"""LLMEngine: requests in, one step at a time, deltas out. The synchronous heart of ember."""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass

from ember.config.model import ModelConfig
from ember.engine.bad_words import bad_word_token_ids
from ember.engine.builder import EngineBuilder
from ember.engine.config import EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.lora_request import LoRARequest
from ember.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from ember.engine.rejection import RequestRejected
from ember.engine.request import Request, Sequence, SequenceStatus, make_sequence
from ember.engine.runner import StepResult
from ember.engine.scheduler import ScheduledSequence, SchedulerOutput
from ember.engine.threads import SlowStepWatch, ThreadGovernor, apply_num_threads
from ember.layers.sampler import SampledToken
from ember.models.loader import LoadedModel


@dataclass(frozen=True)
class StepRecord:
    """What one step ran: which requests, how many tokens, how long it took."""

    step_index: int
    request_ids: tuple[str, ...]
    num_scheduled_tokens: int
    num_preempted: int
    duration_s: float


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's queues, cache and counters."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    kv_cache_bytes: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_steps: int
    prompt_tokens_total: int
    generation_tokens_total: int
    computed_tokens_total: int
    spec_draft_tokens_total: int = 0  # a tree of drafts counts its depth (the most it could keep), not its nodes
    spec_accepted_tokens_total: int = 0
    spec_verifications_total: int = 0
    spec_draft_time_s: float = 0.0
    spec_verify_time_s: float = 0.0
    spec_accepted_histogram: tuple[int, ...] = ()  # [j] = verifications that kept j drafted tokens
    num_waiting_preempted: int = 0  # of num_waiting: sequences preempted after their first token (a server's count misses them)
    num_free_seats: int = 0  # sequences the next step may admit beside the running ones (max_num_seqs - num_running)
    num_slow_steps: int = 0  # steps many times slower than the median of their size (ember.engine.threads.SlowStepWatch)
    num_threads: int = 1  # CPU threads the latest step ran with (the governor's choice unless --threads fixed it)
    num_thread_changes: int = 0  # times the governor moved a step size to another thread count

    @property
    def spec_acceptance_rate(self) -> float:
        """Share of drafted tokens the target kept (0 when nothing was drafted)."""
        return self.spec_accepted_tokens_total / self.spec_draft_tokens_total if self.spec_draft_tokens_total else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens one verification emitted on average: kept drafts plus the one drawn after them."""
        if not self.spec_verifications_total:
            return 0.0
        return (self.spec_accepted_tokens_total + self.spec_verifications_total) / self.spec_verifications_total


class LLMEngine:
    """Owns model, tokenizer, KV cache, scheduler and runner; `step()` advances every running request."""

    def __init__(
        self,
        config: EngineConfig,
        show_progress: bool = False,
        loaded: LoadedModel | None = None,
        draft_loaded: LoadedModel | None = None,
    ) -> None:
        """`loaded` (`draft_loaded`) reuses weights already in memory (they hold no per-engine state);
        else `config.model` (the speculative draft model) is loaded. The parts are wired by `EngineBuilder`."""
        self.config = config
        self.num_threads = apply_num_threads(config.num_threads)  # before any kernel runs (loading included)
        parts = EngineBuilder(config, show_progress).build(loaded, draft_loaded)
        self.model_config: ModelConfig = parts.model_config
        self.model_name = parts.model_name
        self.tokenizer_source = parts.tokenizer_source
        self.tokenizer = parts.tokenizer
        self.max_model_len = parts.max_model_len
        self.block_size = parts.block_size
        self.workers = parts.workers
        self.kv = parts.kv
        self.scheduler = parts.scheduler
        self.limits = parts.limits
        self.speculator = parts.speculator
        self.runner = parts.runner
        self.adapters = parts.adapters
        self.stop_checker = parts.stop_checker
        self.structured_outputs = parts.structured_outputs
        self.kv_cache_bytes = self.runner.kv_cache_bytes  # fixed once allocated; summing the tensors was most of stats()
        self.requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._aborted_outputs: list[RequestOutput] = []
        self._step_records: collections.deque[StepRecord] = collections.deque(maxlen=4096)
        self._counters = collections.Counter()
        self.slow_steps = SlowStepWatch()
        # Threads follow the machine's load unless the user fixed them; tensor-parallel ranks keep their share,
        # and a GPU's steps do not run on the CPU's threads.
        governed = config.num_threads is None and self.workers is None and config.device.resolved().type == "cpu"
        self.governor = ThreadGovernor(self.num_threads) if governed else None

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        """Check `request` against this engine's limits (RequestRejected naming the field to change), then queue it."""
        self.limits.check(request)
        self.add_checked_request(request)

    def add_checked_request(self, request: EngineRequest) -> None:
        """Queue a request already checked against `self.limits` (by an EngineClient at its door); ValueError when
        its id is in use, RequestRejected naming "lora_request" when its adapter cannot be served."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if request.lora_request is not None:
            self.check_adapter(request.lora_request)
        params = request.params
        queued = Request(request, next(self._arrivals), bad_word_ids=bad_word_token_ids(self.tokenizer, params.bad_words))
        forks = params.n > 1 and len(request.prompt_token_ids) > 1
        count = 1 if forks else params.n
        queued.sequences = [self._new_sequence(queued, i, request.prompt_token_ids) for i in range(count)]
        queued.sequences[0].fork_pending = forks
        if params.prompt_logprobs is not None:
            queued.prompt_logprobs = [None]
        self.requests[request.request_id] = queued
        for seq in queued.sequences:
            self.scheduler.add_sequence(seq)
        self._counters["prompt_tokens"] += len(request.prompt_token_ids)

    def check_adapter(self, lora_request: LoRARequest) -> None:
        """Read the adapter `lora_request` names (kept for its requests); RequestRejected naming "lora_request" when
        this engine serves no adapters or cannot serve this one."""
        if self.adapters is None:
            raise RequestRejected("this engine serves no LoRA adapters: start it with enable_lora=True (--enable-lora)",
                                  "lora_request")
        self.adapters.add(lora_request)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now; its blocks go back to the pool. Unknown ids are ignored."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.sequences:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.retain(self.scheduler.running)
        self._aborted_outputs.append(self._delta(request, request.sequences))

    @property
    def num_steps(self) -> int:
        """Steps that ran the model so far (what `stats().num_steps` says, without building the snapshot)."""
        return self._counters["steps"]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._aborted_outputs)

    # -- stepping ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, detokenize; returns the deltas of changed requests."""
        outputs, self._aborted_outputs = self._aborted_outputs, []
        drafts = self.speculator.propose(self.scheduler.running) if self.speculator is not None else {}
        plan = self.scheduler.schedule(drafts)
        if plan.is_empty:
            return outputs
        if self.governor is not None:
            self.governor.threads_for(plan.num_batched_tokens)
        started = time.perf_counter()
        result = self.runner.execute(plan)
        duration_s = time.perf_counter() - started
        if self.governor is not None:
            self.governor.observe(duration_s)
        outputs.extend(self._process(plan, result))
        self._record(plan, duration_s)
        if self.speculator is not None:
            self.speculator.observe(result.last_hidden)
            self.speculator.retain(self.scheduler.running)
        return outputs

    def _process(self, plan: SchedulerOutput, result: StepResult) -> list[RequestOutput]:
        changed: dict[str, list[Sequence]] = {}
        for item in plan.scheduled:
            seq = item.seq
            tokens = result.sampled.get(seq.seq_id, [])
            num_rejected = self._count_verification(item, tokens)
            seq.num_computed_tokens += item.num_new_tokens - num_rejected
            if seq.seq_id in result.prompt_logprobs:
                self._add_prompt_logprobs(seq.request, result.prompt_logprobs[seq.seq_id])
            if seq.fork_pending and seq.num_computed_tokens == seq.compute_target:
                self._fork(seq)
            num_dropped = self._append_kept(seq, tokens)
            seq.num_computed_tokens -= num_dropped
            num_rejected += num_dropped
            if tokens and seq.finish_reason is None and self._jumps_forward(seq):
                self._jump_forward(seq)
            if num_rejected and seq.finish_reason is None:
                self.scheduler.roll_back(seq)
            if seq.seq_id in result.embeddings:
                self._finish_embedding(seq, result.embeddings[seq.seq_id])
            if tokens or seq.seq_id in result.embeddings:
                changed.setdefault(seq.request.request_id, []).append(seq)
        outputs = []
        for request_id, seqs in changed.items():
            request = self.requests[request_id]
            outputs.append(self._delta(request, seqs))
            if request.finished:
                request.metrics.finished_time = time.monotonic()
                del self.requests[request_id]
        return outputs

    def _finish_embedding(self, seq: Sequence, embedding: list[float]) -> None:
        """An `embed` request is done once its prompt is computed: its embedding kept, no token generated."""
        seq.request.embedding = embedding
        seq.finish_reason = "stop"
        self.scheduler.finish(seq)

    def _count_verification(self, item: ScheduledSequence, tokens: list[SampledToken]) -> int:
        """Record what verification kept of `item`'s drafts; returns how many were rejected."""
        if item.draft is None or self.speculator is None:
            return 0
        num_accepted = len(tokens) - 1
        self.speculator.record(item.seq, item.draft.depth, num_accepted)
        return item.num_draft_tokens - num_accepted

    def _append_kept(self, seq: Sequence, tokens: list[SampledToken]) -> int:
        """Append the step's kept tokens (verified drafts, then the bonus token) until a stop or a forced run; returns
        how many verified drafts were dropped. Where the constraint forces a run after a kept draft, the run replaces
        the tokens verified past it, as it would have without speculation (jump-forward happens after every token)."""
        for index, token in enumerate(tokens):
            self._append(seq, token)
            if seq.finish_reason is not None:
                return 0  # a stop inside the kept drafts ends the sequence there
            num_after = len(tokens) - 1 - index  # kept drafts after this one, and the bonus token (never computed)
            if num_after and self._jumps_forward(seq) and seq.guide.forced_tokens():
                return num_after - 1
        return 0

    def _jumps_forward(self, seq: Sequence) -> bool:
        """Whether forced tokens may skip the sampler for `seq`: it is constrained, and nothing the sampler would apply
        to them (logprobs, an allowed list or bias, bad words, min_tokens' bans) is asked."""
        params = seq.params
        return (self.config.jump_forward and seq.guide is not None and params.logprobs is None
                and not params.restricts_tokens and not params.bad_words and seq.num_output_tokens >= params.min_tokens)

    def _jump_forward(self, seq: Sequence) -> None:
        """Append the tokens `seq`'s constraint forces, through the stop checker one by one (detokenized, stop strings
        and max_tokens checked exactly as for sampled ones); their KV is computed with the next sampled token's step."""
        while seq.finish_reason is None:
            forced = seq.guide.forced_tokens()
            if not forced:
                return
            for token_id in forced:
                self._append(seq, SampledToken(token_id))
                if seq.finish_reason is not None:
                    return

    def _new_sequence(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        guide = self.structured_outputs.guide(request.params.structured_output)
        return make_sequence(request, index, self.tokenizer, token_ids, guide)

    def _fork(self, parent: Sequence) -> None:
        parent.fork_pending = False
        request = parent.request
        children = [self._new_sequence(request, i, parent.token_ids) for i in range(1, request.params.n)]
        request.sequences.extend(children)
        self.scheduler.fork(parent, children)

    def _append(self, seq: Sequence, token: SampledToken) -> None:
        request = seq.request
        if request.metrics.first_token_time is None:
            request.metrics.first_token_time = time.monotonic()
        if seq.params.logprobs is not None:
            seq.pending_logprobs.append(self._position_logprobs(token))
            seq.cumulative_logprob += token.logprob or 0.0
        self.stop_checker.append_token(seq, token.token_id)
        self._counters["generation_tokens"] += 1
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)

    def _delta(self, request: Request, seqs: list[Sequence]) -> RequestOutput:
        completions = [self._completion_delta(seq) for seq in seqs]
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            outputs=completions,
            finished=request.finished or all(s.finish_reason == "abort" for s in seqs),
            prompt=request.asked.prompt,
            num_cached_tokens=request.num_cached_tokens,
            prompt_logprobs=request.prompt_logprobs,
            metrics=request.metrics,
            embedding=request.embedding,
        )

    def _completion_delta(self, seq: Sequence) -> CompletionOutput:
        end = self.stop_checker.emittable_text_end(seq)
        text = seq.text[seq.num_emitted_chars : end]
        seq.num_emitted_chars = max(seq.num_emitted_chars, end)
        token_ids = seq.token_ids[seq.num_prompt_tokens + seq.num_emitted_tokens :]  # the new tokens, not a copy of all
        seq.num_emitted_tokens = seq.num_output_tokens
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs, seq.pending_logprobs = seq.pending_logprobs, []
        return CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            cumulative_logprob=seq.cumulative_logprob if seq.params.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )

    def _position_logprobs(self, token: SampledToken) -> PositionLogprobs:
        entries = {token.token_id: Logprob(token.logprob or 0.0, token.rank or 1, self._piece(token.token_id))}
        for rank, (token_id, value) in enumerate(zip(token.top_token_ids or [], token.top_logprobs or [], strict=True), 1):
            entries.setdefault(token_id, Logprob(value, rank, self._piece(token_id)))
        return entries

    def _add_prompt_logprobs(self, request: Request, tokens: list[SampledToken]) -> None:
        assert request.prompt_logprobs is not None
        request.prompt_logprobs.extend(self._position_logprobs(token) for token in tokens)

    def _piece(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    # -- bookkeeping ------------------------------------------------------------------------

    def _record(self, plan: SchedulerOutput, duration_s: float) -> None:
        if self.speculator is not None:
            num_drafts = sum(item.num_draft_tokens for item in plan.scheduled)
            decode_shaped = all(item.num_new_tokens == 1 + item.num_draft_tokens for item in plan.scheduled)
            self.speculator.observe_step(plan.num_batched_tokens, num_drafts, duration_s, decode_shaped)
        self._counters["steps"] += 1
        self._counters["computed_tokens"] += plan.num_batched_tokens
        request_ids = tuple(dict.fromkeys(item.seq.request.request_id for item in plan.scheduled))
        self._step_records.append(
            StepRecord(self._counters["steps"], request_ids, plan.num_batched_tokens, len(plan.preempted), duration_s)
        )
        self.slow_steps.observe(plan.num_batched_tokens, duration_s)

    def step_records(self) -> list[StepRecord]:
        return list(self._step_records)

    def check_health(self) -> None:
        """Raise WorkerFailedError when a tensor-parallel worker has died (nothing to check otherwise)."""
        if self.workers is not None:
            self.workers.check_alive()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (a single-process engine holds nothing to stop)."""
        self.runner.close()
        if self.workers is not None:
            self.workers.shutdown()

    def latest_step_record(self) -> StepRecord | None:
        """The record of the most recent step that ran the model, if any."""
        return self._step_records[-1] if self._step_records else None

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.kv.usage,
            num_free_blocks=self.kv.num_free_blocks,
            num_total_blocks=self.kv.num_blocks,
            block_size=self.block_size,
            kv_cache_bytes=self.kv_cache_bytes,
            prefix_cache_queries=self.kv.prefix_stats.queries,
            prefix_cache_hits=self.kv.prefix_stats.hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self._counters["steps"],
            prompt_tokens_total=self._counters["prompt_tokens"],
            generation_tokens_total=self._counters["generation_tokens"],
            computed_tokens_total=self._counters["computed_tokens"],
            num_waiting_preempted=sum(1 for seq in self.scheduler.waiting if seq.num_output_tokens),
            num_free_seats=max(0, self.config.scheduler.max_num_seqs - len(self.scheduler.running)),
            num_slow_steps=self.slow_steps.num_slow_steps,
            num_threads=self.governor.threads if self.governor is not None else self.num_threads,
            num_thread_changes=self.governor.num_changes if self.governor is not None else 0,
            **self._speculation_stats(),
        )

    def _speculation_stats(self) -> dict:
        if self.speculator is None:
            return {}
        spec = self.speculator.stats
        return dict(
            spec_draft_tokens_total=spec.draft_tokens,
            spec_accepted_tokens_total=spec.accepted_tokens,
            spec_verifications_total=spec.verifications,
            spec_draft_time_s=spec.draft_time_s,
            spec_verify_time_s=spec.verify_time_s,
            spec_accepted_histogram=tuple(spec.accepted_histogram),
        )



__all__ = ["EngineStats", "LLMEngine", "SequenceStatus", "StepRecord"]
