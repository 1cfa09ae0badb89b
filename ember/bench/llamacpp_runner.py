"""llama.cpp through llama-cpp-python's low-level API: continuous batching over parallel slots.

This is what llama-server does with `--parallel N`: N sequences share one context (a unified KV
cache); each step decodes one token for every generating slot plus prompt tokens of the slots
still in prefill, up to `n_batch`; a slot that finishes takes the next waiting request. Greedy
(argmax) and no stop on EOS, so every request makes exactly its target number of tokens.
The model is an F32/BF16 GGUF of ember's very weights (ember.bench.gguf_export).
The model is loaded with `use_extra_bufts = False`: with weight repacking on, llama_decode crashed on batches of
more than one token on every CPU tried (NO_EXTRA_BUFTS_REASON; the bench records it with the peer's settings).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ember.bench.results import RequestTiming, RunResult
from ember.bench.roofline import cpu_threads
from ember.bench.workloads import BenchRequest, Workload


def llamacpp_available() -> str | None:
    """None if llama-cpp-python can be imported, else why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (pip install 'ember[bench]'; it compiles llama.cpp, about 15 minutes here)"
    except OSError as error:  # the shared library failed to load
        return f"llama-cpp-python is installed but its library does not load: {error}"
    return None


_QUIET_LOG = []  # the ctypes callback must outlive every llama.cpp call that may log


def _silence_llama_log(lc) -> None:
    """llama.cpp logs every tensor it loads to stderr; a benchmark's progress bar needs quiet."""
    if not _QUIET_LOG:
        _QUIET_LOG.append(lc.llama_log_callback(lambda level, text, user_data: None))
    lc.llama_log_set(_QUIET_LOG[0], None)


@dataclass
class _Slot:
    request: BenchRequest
    timing: RequestTiming
    pending: list[int]  # prompt tokens not yet decoded
    position: int = 0
    last_token: int | None = None
    generated: int = 0
    index_in_batch: int | None = field(default=None)


# Why weight repacking is off (see the module docstring): a measured crash, not a preference.
NO_EXTRA_BUFTS_REASON = ("weight repacking (use_extra_bufts) makes llama_decode crash (segfault) on batches of more than one "
                         "token on the CPUs tried: an AMD EPYC (Zen 5) and an Intel Xeon with AMX (llama-cpp-python 0.3.36)")


def _context_settings(context_params, n_batch: int, slots: int) -> dict:
    """What this peer runs with, read back from the context parameters it is given (for the report)."""
    flash = getattr(context_params, "flash_attn_type", None)
    if flash is not None:
        flash_attention = {-1: "auto", 0: "off", 1: "on"}.get(int(flash), str(flash))
    else:
        flash_attention = "on" if getattr(context_params, "flash_attn", False) else "off"
    return {
        "threads": int(context_params.n_threads),
        "threads_batch": int(context_params.n_threads_batch),
        "flash_attention": flash_attention,
        "use_extra_bufts": False,
        "use_extra_bufts_why_off": NO_EXTRA_BUFTS_REASON,
        "parallel_sequences": slots,
        "n_batch": n_batch,
        "kv_unified": bool(getattr(context_params, "kv_unified", False)),
        "n_ctx": int(context_params.n_ctx),
    }


class LlamaCppRunner:
    """One llama.cpp model and context with `slots` parallel sequences."""

    def __init__(self, gguf_path: Path, dtype: str, slots: int = 16, slot_context: int = 1024, n_batch: int = 512, threads: int | None = None) -> None:
        import llama_cpp as lc

        self.lc = lc
        self.dtype = dtype
        self.slots = slots
        self.n_batch = n_batch
        _silence_llama_log(lc)
        lc.llama_backend_init()
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = False
        self.model = lc.llama_model_load_from_file(str(gguf_path).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        context_params = lc.llama_context_default_params()
        context_params.n_ctx = -(-slots * slot_context // 256) * 256
        context_params.n_batch = n_batch
        context_params.n_ubatch = n_batch
        context_params.n_seq_max = slots
        context_params.kv_unified = True
        context_params.no_perf = True
        context_params.n_threads = context_params.n_threads_batch = threads or cpu_threads()
        self.settings = _context_settings(context_params, n_batch, slots)
        self.ctx = lc.llama_init_from_model(self.model, context_params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.memory = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(n_batch, 0, slots)
        self._warm_up()

    def close(self) -> None:
        lc = self.lc
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)

    def _warm_up(self) -> None:
        warm = Workload("warmup", 0, [BenchRequest("warmup", [7] * 24, 4)])
        self.run(warm)

    def run(self, workload: Workload) -> RunResult:
        import numpy as np

        lc = self.lc
        lc.llama_memory_clear(self.memory, True)
        waiting = list(workload.requests)
        free = list(range(self.slots))
        active: dict[int, _Slot] = {}
        timings: list[RequestTiming] = []
        started = time.monotonic()
        while waiting or active:
            while free and waiting:
                request = waiting.pop(0)
                timing = RequestTiming(request.request_id, request.role, request.prompt_len, 0, started)
                timings.append(timing)
                active[free.pop(0)] = _Slot(request, timing, list(request.prompt_token_ids))
            self._fill_batch(active)
            if lc.llama_decode(self.ctx, self.batch) != 0:
                raise RuntimeError("llama_decode failed (out of KV cells?)")
            now = time.monotonic()
            for slot_id, slot in list(active.items()):
                if slot.index_in_batch is None:
                    continue
                logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, slot.index_in_batch), shape=(self.n_vocab,))
                slot.last_token = int(logits.argmax())
                slot.generated += 1
                slot.timing.output_tokens += 1
                slot.timing.token_times.append(now)
                if slot.timing.first_token is None:
                    slot.timing.first_token = now
                if slot.generated >= slot.request.max_tokens:
                    slot.timing.finished = now
                    lc.llama_memory_seq_rm(self.memory, slot_id, -1, -1)
                    del active[slot_id]
                    free.append(slot_id)
        wall_s = time.monotonic() - started
        extra = {"dtype": self.dtype, "slots": self.slots, "n_batch": self.n_batch, "settings": self.settings}
        return RunResult("llama.cpp", workload.name, wall_s, sum(t.output_tokens for t in timings), timings, extra)

    def _fill_batch(self, active: dict[int, _Slot]) -> None:
        """Decode tokens first (one per generating slot), then prompt chunks up to n_batch."""
        batch = self.batch
        count = 0

        def add(token: int, position: int, slot_id: int, wants_logits: bool) -> None:
            nonlocal count
            batch.token[count] = token
            batch.pos[count] = position
            batch.n_seq_id[count] = 1
            batch.seq_id[count][0] = slot_id
            batch.logits[count] = wants_logits
            count += 1

        for slot_id, slot in active.items():
            slot.index_in_batch = None
            if not slot.pending and slot.last_token is not None:
                slot.index_in_batch = count
                add(slot.last_token, slot.position, slot_id, True)
                slot.position += 1
        for slot_id, slot in active.items():
            if not slot.pending or count >= self.n_batch:
                continue
            take = min(len(slot.pending), self.n_batch - count)
            chunk, slot.pending = slot.pending[:take], slot.pending[take:]
            for i, token in enumerate(chunk):
                last = not slot.pending and i == len(chunk) - 1
                if last:
                    slot.index_in_batch = count
                add(token, slot.position, slot_id, last)
                slot.position += 1
        batch.n_tokens = count
