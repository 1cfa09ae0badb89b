"""LLMEngine: requests in, one step at a time, deltas out. The synchronous heart of ember."""

from __future__ import annotations

import collections
import itertools
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ember.engine.bad_words import bad_word_token_ids
from ember.engine.config import DEFAULT_TREE_NODES, EngineConfig
from ember.engine.limits import RequestLimits
from ember.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from ember.engine.request import Request, Sequence, SequenceStatus, make_sequence
from ember.engine.runner import (
    ModelRunner,
    StepResult,
    kv_cache_bytes_per_block,
    kv_cache_layout,
    kv_cache_torch_dtype,
    verifies_trees,
)
from ember.engine.sampling_params import SamplingParams
from ember.engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from ember.engine.spec.speculator import Proposer, Speculator
from ember.engine.stop_checker import StopChecker
from ember.engine.structured.structured_outputs import StructuredOutputs
from ember.engine.threads import SlowStepWatch, apply_num_threads
from ember.kv.cache_manager import KVCacheManager
from ember.layers.rejection_sampler import RejectionSampler
from ember.layers.sampler import SampledToken, Sampler
from ember.models.config import ModelConfig
from ember.models.loader import LoadedModel, compute_dtype, load_model
from ember.models.registry import resolve_model
from ember.quant.ggml_kernels import MAX_GEMV_ROWS
from ember.quant.ggml_layers import set_activations
from ember.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from ember.parallel.driver import WorkerGroup

DEFAULT_KV_CACHE_BYTES = 1 << 30


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
        else `config.model` (the speculative draft model) is loaded."""
        self.config = config
        self.num_threads = apply_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        model_path = resolve_model(config.model)
        self.workers: WorkerGroup | None = None
        if loaded is None and config.parallel.is_parallel:
            from ember.parallel.driver import WorkerGroup

            self.workers, loaded = WorkerGroup.start(model_path, config.dtype, config.parallel, show_progress, config.max_model_len)
        loaded = loaded or load_model(model_path, config.dtype, show_progress=show_progress, max_model_len=config.max_model_len,
                                      quantization=config.quantization)
        num_ggml_layers = set_activations(loaded.model, config.quant_activations)  # 0 without GGML layers
        self.rounds_activations = rounds_activations(loaded.model, num_ggml_layers, config.quant_activations)
        self.rows_per_weight_pass = MAX_GEMV_ROWS if num_ggml_layers else None  # decode-sized products run in passes
        self.model_config: ModelConfig = loaded.config
        self.model_name = config.served_model_name or default_model_name(config.model)
        self.tokenizer_source = _tokenizer_source(config, loaded)
        self.tokenizer = load_tokenizer_from(self.tokenizer_source)
        positions = loaded.config.rotary_table_positions  # the model's context, or the one it was loaded for
        self.max_model_len = min(config.max_model_len or positions, positions)
        self.block_size = config.cache.block_size
        self.kv_layout = kv_cache_layout(loaded.model)
        self.kv_cache_dtype = kv_cache_torch_dtype(config.cache.kv_cache_dtype) or compute_dtype(config.dtype)
        num_blocks = self._num_kv_blocks(loaded.config)
        self.kv = KVCacheManager(
            num_blocks, self.block_size, config.cache.enable_prefix_caching, self.kv_layout.group_windows
        )
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.limits = RequestLimits(
            vocab_size=loaded.config.vocab_size,
            max_model_len=self.max_model_len,
            num_kv_blocks=num_blocks,
            block_size=self.block_size,
            group_windows=tuple(self.kv_layout.group_windows),
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
            max_num_seqs=config.scheduler.max_num_seqs,
            enable_chunked_prefill=config.scheduler.enable_chunked_prefill,
        )
        generator = torch.Generator().manual_seed(config.seed)
        self.eos_ids = self.tokenizer.eos_ids if self.tokenizer is not None else frozenset()
        self.speculator = self._make_speculator(num_blocks, show_progress, draft_loaded, loaded.model)
        rejection = RejectionSampler(generator) if self.speculator is not None else None
        self.runner = ModelRunner(
            loaded.model, num_blocks, self.block_size, self.kv, Sampler(generator), self.eos_ids, rejection, self.workers,
            self.kv_cache_dtype, keeps_last_hidden=self.speculator is not None and self.speculator.proposer.uses_last_hidden,
        )
        self.kv_cache_bytes = self.runner.kv_cache_bytes  # fixed once allocated; summing the tensors was most of stats()
        self.stop_checker = StopChecker(self.eos_ids, self.max_model_len)
        self.structured_outputs = StructuredOutputs(self.tokenizer, loaded.config.vocab_size)
        self.requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._aborted_outputs: list[RequestOutput] = []
        self._step_records: collections.deque[StepRecord] = collections.deque(maxlen=4096)
        self._counters = collections.Counter()
        self.slow_steps = SlowStepWatch()

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; raises ValueError (saying what to change) if it can never run. A `cache_salt` keeps its KV
        blocks out of other requests' prefix-cache hits (only requests with the same salt share them)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validate_request(prompt_token_ids, params)
        bad_words = bad_word_token_ids(self.tokenizer, params.bad_words)
        request = Request(request_id, list(prompt_token_ids), params, prompt, priority, next(self._arrivals), bad_word_ids=bad_words,
                          cache_salt=cache_salt)
        forks = params.n > 1 and len(prompt_token_ids) > 1
        count = 1 if forks else params.n
        request.sequences = [self._new_sequence(request, i, prompt_token_ids) for i in range(count)]
        request.sequences[0].fork_pending = forks
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = [None]
        self.requests[request_id] = request
        for seq in request.sequences:
            self.scheduler.add_sequence(seq)
        self._counters["prompt_tokens"] += len(prompt_token_ids)

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
        started = time.perf_counter()
        result = self.runner.execute(plan)
        duration_s = time.perf_counter() - started
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
            for token in tokens:
                self._append(seq, token)
                if seq.finish_reason is not None:
                    break  # a stop inside the kept drafts ends the sequence there
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
            prompt=request.prompt,
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
            num_total_blocks=self.kv.pool.num_blocks,
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

    def _make_speculator(
        self, num_blocks: int, show_progress: bool, draft: LoadedModel | None, target: torch.nn.Module
    ) -> Speculator | None:
        """The configured proposer behind a speculator, or None when speculation is off."""
        spec = self.config.speculative
        if not spec.enabled:
            return None
        if spec.method == "ngram":
            from ember.engine.spec.ngram import NgramProposer

            return self._speculator(NgramProposer(spec.ngram_max, spec.ngram_min))
        if spec.method == "medusa":
            return self._medusa_speculator(target)
        if spec.method == "eagle":
            return self._eagle_speculator(target)
        from ember.engine.spec.draft_model import DraftModelProposer

        assert spec.draft_model is not None  # SpeculativeConfig checked it
        draft = draft or load_model(resolve_model(spec.draft_model), spec.draft_dtype or self.config.dtype, show_progress=show_progress,
                                    max_model_len=self.max_model_len)
        if draft.config.vocab_size != self.model_config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft.config.vocab_size} tokens) differs from the target's "
                f"({self.model_config.vocab_size}); give a draft model with the same tokenizer"
            )
        # An explicit cache dtype holds for the draft's cache too (same block count); "auto" follows the draft's dtype.
        cache_dtype = kv_cache_torch_dtype(self.config.cache.kv_cache_dtype)
        proposer = DraftModelProposer(draft.model, num_blocks, self.block_size, self._proposer_generator(),
                                      draft.config.max_position_embeddings, cache_dtype)
        return self._speculator(proposer)

    def _eagle_speculator(self, target: torch.nn.Module) -> Speculator:
        """An EAGLE-style head checked against the target."""
        from ember.engine.spec.eagle import EagleProposer
        from ember.engine.spec.eagle_head import load_eagle_head

        spec = self.config.speculative
        self._refuse_split_lm_head("an EAGLE head reads")
        assert spec.eagle_head is not None  # SpeculativeConfig checked it
        head = load_eagle_head(spec.eagle_head, target)
        return self._speculator(EagleProposer(head, target, self._proposer_generator()))

    def _medusa_speculator(self, target: torch.nn.Module) -> Speculator:
        """Medusa heads checked against the target, drafting at most one token per head."""
        from ember.engine.spec.medusa import MedusaProposer
        from ember.engine.spec.medusa_heads import load_medusa_heads

        spec = self.config.speculative
        self._refuse_split_lm_head("Medusa heads read")
        assert spec.medusa_heads is not None  # SpeculativeConfig checked it
        heads = load_medusa_heads(spec.medusa_heads, target)
        if not spec.draft_length_given and spec.num_speculative_tokens > heads.num_heads:
            spec = self.config.speculative = replace(spec, num_speculative_tokens=heads.num_heads)  # as vLLM takes K from the heads
        if spec.num_speculative_tokens > heads.num_heads:
            raise ValueError(
                f"the Medusa heads in {spec.medusa_heads} draft at most {heads.num_heads} tokens; "
                f"pass num_speculative_tokens <= {heads.num_heads} (--num-speculative-tokens) or train more heads"
            )
        # The runner is built after the speculator; whether it verifies trees follows from the same model and workers.
        tree_nodes = spec.medusa_tree_nodes
        if tree_nodes is None:
            tree_nodes = 0 if self.rounds_activations else DEFAULT_TREE_NODES
        if not verifies_trees(kv_cache_layout(target), self.workers):
            tree_nodes = 0
        return self._speculator(MedusaProposer(heads, target, self._proposer_generator(), tree_nodes))

    def _speculator(self, proposer: Proposer) -> Speculator:
        """`proposer` behind this engine's speculative config, told how the target's products run (passes or not)."""
        return Speculator(self.config.speculative, proposer, self.rows_per_weight_pass)

    def _refuse_split_lm_head(self, reader: str) -> None:
        """Heads over the target's LM head need all of it, which tensor parallelism splits across ranks."""
        if self.workers is not None:
            raise ValueError(f"{reader} the whole LM head, which tensor parallelism splits; run without --tensor-parallel-size")

    def _proposer_generator(self) -> torch.Generator:
        """The proposers' own random stream (unseeded sampled drafts), apart from the sampler's."""
        return torch.Generator().manual_seed(self.config.seed + 1)

    def _num_kv_blocks(self, config: ModelConfig) -> int:
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        per_block = kv_cache_bytes_per_block(config, self.block_size, self.kv_cache_dtype, self.kv_layout)
        if cache.kv_cache_memory_bytes is not None:
            blocks = cache.kv_cache_memory_bytes // per_block
            if blocks < 1:
                raise ValueError(f"--kv-cache-memory {cache.kv_cache_memory_bytes} holds no block; one block takes {per_block} bytes")
            return blocks
        wanted = -(-self.max_model_len // self.block_size) * self.config.scheduler.max_num_seqs
        return max(1, min(wanted, DEFAULT_KV_CACHE_BYTES // per_block))

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestRejected (a ValueError saying what to change) if this request could never run here."""
        self.limits.validate(prompt_token_ids, params)
        self.structured_outputs.check(params.structured_output)


def rounds_activations(model: torch.nn.Module, num_ggml_layers: int, quant_activations: str) -> bool:
    """Whether some layer rounds its input to int8 (GGML layers with int8 activations, SmoothQuant's W8A8)."""
    from ember.quant.w8a8_layers import W8A8Linear

    if num_ggml_layers and quant_activations == "int8":
        return True
    return any(isinstance(module, W8A8Linear) for module in model.modules())


def default_model_name(given: str) -> str:
    """A registered name as it is; a path by its file or folder name (a folder holding one GGUF: the folder's)."""
    return given if not Path(given).exists() else Path(os.path.abspath(Path(given).expanduser())).stem


def _tokenizer_source(config: EngineConfig, loaded: LoadedModel) -> Path | None:
    """The file the tokenizer comes from: `--tokenizer`, else the model's own, else none."""
    return Path(config.tokenizer) if config.tokenizer else loaded.tokenizer_path


def load_tokenizer_from(source: Path | None) -> Tokenizer | None:
    """The tokenizer stored at `source` (None when there is none)."""
    if source is None:
        return None
    from ember.tokenizers import load as load_tokenizer

    return load_tokenizer(source)


__all__ = ["EngineStats", "LLMEngine", "SequenceStatus", "StepRecord"]
