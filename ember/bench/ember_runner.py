"""Runs a workload through ember's LLMEngine, with any one lever switched off.

Levers: prefix caching, chunked prefill (each an engine config flag) and continuous batching,
which is switched off by feeding the engine static batches: add `static_batch_size` requests,
step until every one has finished, then the next batch (no refill while a batch runs).
Each run builds a fresh engine (so no prefix cache survives from a previous repeat) and warms
it up with one short request of token ids that no workload contains.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ember.bench.results import RequestTiming, RunResult
from ember.bench.workloads import BenchRequest, Workload
from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from ember.engine.device import DeviceConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.structured import StructuredOutput


@dataclass(frozen=True)
class EmberSettings:
    """The engine configuration of one ember variant, named for the report."""

    label: str = "ember"
    enable_prefix_caching: bool = True
    prefix_cache: str = "hash"  # which prefix cache (ember.kv.cache_manager.PREFIX_CACHES)
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = None  # None: the engine's own default
    max_num_seqs: int | None = None
    static_batch_size: int | None = None  # None: continuous batching
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    speculative_method: str | None = None  # None: no speculative decoding
    num_speculative_tokens: int | None = None  # None: the engine's default for the method
    draft_model: str | None = None
    draft_dtype: str | None = None
    medusa_heads: str | None = None
    eagle_head: str | None = None
    adaptive_speculation: bool = True
    structured_output: StructuredOutput | None = None  # every request's output constraint (None: free text)
    untimed_passes: int = 0  # times the workload runs on the engine before the timed pass (a server that served it)
    device: str = "cpu"  # the engine's (DeviceConfig.device); the peers run on the CPU
    structured_outputs_backend: str = "auto"  # who enforces `structured_output` (ember.engine.structured.grammars.BACKENDS)

    def config(self, model: str, dtype: str) -> EngineConfig:
        """The engine's defaults, except the levers and limits this variant sets."""
        scheduler = {"enable_chunked_prefill": self.enable_chunked_prefill}
        if self.max_num_batched_tokens is not None:
            scheduler["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.max_num_seqs is not None:
            scheduler["max_num_seqs"] = self.max_num_seqs
        return EngineConfig(
            model=model,
            dtype=dtype,
            cache=CacheConfig(enable_prefix_caching=self.enable_prefix_caching, kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                              kv_cache_dtype=self.kv_cache_dtype, prefix_cache=self.prefix_cache),
            scheduler=SchedulerConfig(**scheduler),
            speculative=SpeculativeConfig(
                method=self.speculative_method,
                num_speculative_tokens=self.num_speculative_tokens,
                draft_model=self.draft_model,
                draft_dtype=self.draft_dtype,
                medusa_heads=self.medusa_heads,
                eagle_head=self.eagle_head,
                adaptive=self.adaptive_speculation,
            ),
            device=DeviceConfig(self.device),
            structured_outputs_backend=self.structured_outputs_backend,
        )

    def record(self) -> dict:
        """The settings as JSON values (a structured output by its constraint's spelling)."""
        return {**self.__dict__, "structured_output": None if self.structured_output is None else self.structured_output.key}

    def with_(self, **changes) -> EmberSettings:
        return replace(self, **changes)


@functools.lru_cache(maxsize=4)
def loaded_weights(model: str, dtype: str, device: str = "cpu"):
    """The model's weights, loaded once per process, dtype and device: dequantizing a GGUF takes longer
    than many a timed run, and the weights hold no per-engine state (KV caches live in the runner)."""
    from ember.models.loader import load_model
    from ember.models.registry import resolve_model

    device_config = DeviceConfig(device)
    torch_device = device_config.resolved()
    return load_model(resolve_model(model), device_config.load_dtype(dtype, torch_device), device=torch_device)


def make_engine(model: str, dtype: str, settings: EmberSettings):
    """A fresh engine (empty KV and prefix cache) over the process's shared weights, warmed up."""
    from ember.engine.llm_engine import LLMEngine

    draft = None
    if settings.speculative_method == "draft" and settings.draft_model is not None:
        draft = loaded_weights(settings.draft_model, settings.draft_dtype or dtype, settings.device)
    engine = LLMEngine(settings.config(model, dtype), show_progress=False, loaded=loaded_weights(model, dtype, settings.device),
                       draft_loaded=draft)
    _warm_up(engine)
    return engine


def _warm_up(engine) -> None:
    from ember.engine.sampling_params import SamplingParams

    engine.add_request(EngineRequest("warmup", [7] * 24, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)))
    while engine.has_unfinished_requests():
        engine.step()


def run_ember(model: str, dtype: str, workload: Workload, settings: EmberSettings = EmberSettings()) -> RunResult:
    """One timed pass of `workload` on a freshly built engine."""
    engine = make_engine(model, dtype, settings)
    for _ in range(settings.untimed_passes):
        _run_continuous(engine, workload.requests, settings.structured_output)
    if settings.static_batch_size:
        timings, wall_s = _run_static(engine, workload.requests, settings.static_batch_size, settings.structured_output)
    else:
        timings, wall_s = _run_continuous(engine, workload.requests, settings.structured_output)
    stats = engine.stats()
    extra = {
        "dtype": dtype,
        "settings": settings.record(),
        "prefix_cache_queries": stats.prefix_cache_queries,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "num_preemptions": stats.num_preemptions,
        "num_steps": stats.num_steps,
        "cached_prompt_tokens": sum(t.num_cached_tokens for t in timings.values()),
        "spec_draft_tokens": stats.spec_draft_tokens_total,
        "spec_accepted_tokens": stats.spec_accepted_tokens_total,
        "spec_verifications": stats.spec_verifications_total,
        "spec_acceptance_rate": stats.spec_acceptance_rate,
        "spec_mean_accepted_length": stats.spec_mean_accepted_length,
        "spec_draft_time_s": stats.spec_draft_time_s,
        "spec_verify_time_s": stats.spec_verify_time_s,
        "spec_accepted_histogram": list(stats.spec_accepted_histogram),
    }
    output_tokens = sum(t.output_tokens for t in timings.values())
    return RunResult(settings.label, workload.name, wall_s, output_tokens, list(timings.values()), extra)


def _sampling(request: BenchRequest, structured_output: StructuredOutput | None):
    from ember.engine.sampling_params import SamplingParams

    return SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True, structured_output=structured_output)


def _add(engine, request: BenchRequest, timings: dict[str, RequestTiming], constraint: StructuredOutput | None,
         arrival: float | None = None) -> None:
    arrival = time.monotonic() if arrival is None else arrival
    timings[request.request_id] = RequestTiming(request.request_id, request.role, request.prompt_len, 0, arrival)
    engine.add_request(EngineRequest(request.request_id, request.prompt_token_ids, _sampling(request, constraint)))


def _step(engine, timings: dict[str, RequestTiming]) -> Iterator[str]:
    """One engine step; records token times; yields the ids of requests that finished."""
    outputs = engine.step()
    now = time.monotonic()
    for output in outputs:
        timing = timings.get(output.request_id)
        if timing is None:
            continue
        new_tokens = sum(len(c.token_ids) for c in output.outputs)
        if new_tokens:
            timing.output_tokens += new_tokens
            timing.output_token_ids.extend(t for c in output.outputs if c.index == 0 for t in c.token_ids)
            timing.token_times.append(now)
            if timing.first_token is None:
                timing.first_token = now
        timing.num_cached_tokens = output.num_cached_tokens
        if output.finished:
            timing.finished = now
            yield output.request_id


def _run_continuous(engine, requests: list[BenchRequest], constraint: StructuredOutput | None) -> tuple[dict[str, RequestTiming], float]:
    """Everything with after_tokens == 0 at t=0; the rest once the first request has made that many tokens."""
    timings: dict[str, RequestTiming] = {}
    held = sorted((r for r in requests if r.after_tokens > 0), key=lambda r: r.after_tokens)
    leader = requests[0].request_id
    started = time.monotonic()
    for request in requests:
        if request.after_tokens == 0:
            _add(engine, request, timings, constraint)
    remaining = len(requests)
    while remaining:
        produced = timings[leader].output_tokens if leader in timings else 0
        while held and (held[0].after_tokens <= produced or not engine.has_unfinished_requests()):
            _add(engine, held.pop(0), timings, constraint)
        remaining -= sum(1 for _ in _step(engine, timings))
    return timings, time.monotonic() - started


def _run_static(engine, requests: list[BenchRequest], batch_size: int,
                constraint: StructuredOutput | None) -> tuple[dict[str, RequestTiming], float]:
    timings: dict[str, RequestTiming] = {}
    started = time.monotonic()
    for start in range(0, len(requests), batch_size):
        batch = requests[start : start + batch_size]
        for request in batch:
            _add(engine, request, timings, constraint, arrival=started)  # every request arrived at t=0
        remaining = len(batch)
        while remaining:
            remaining -= sum(1 for _ in _step(engine, timings))
    return timings, time.monotonic() - started
