"""The benchmarks themselves: each runs ember and its peers on one workload and returns a section.

A section is plain JSON: the workload's parameters, per engine the repeated measurements
(median, min, max of at least `repeats` runs) and the ratios the goals are judged by. Repeats
are interleaved (ember, peer, ember, peer, ...) so that drift on a shared machine hits all alike.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from ember.bench import workloads
from ember.bench.ember_runner import EmberSettings, loaded_weights, run_ember
from ember.bench.results import RunResult
from ember.bench.stats import latency_summary, mean, ratio, spread
from ember.bench.workloads import TokenSource, Workload
from ember.engine.config import SchedulerConfig

PEERS = ("hf", "llamacpp", "vllm")
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class SiblingPair:
    """A target and a smaller model of its family with the same tokenizer, as its draft model, both at `dtype`."""

    target: str
    draft: str
    dtype: str = "auto"

    @classmethod
    def parse(cls, text: str) -> SiblingPair:
        """'TARGET,DRAFT' as the command line gives it."""
        parts = [part.strip() for part in text.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"a sibling pair reads TARGET,DRAFT (two models with one tokenizer), not {text!r}")
        return cls(*parts)

    @property
    def models(self) -> tuple[str, str]:
        return (self.target, self.draft)


@dataclass
class BenchOptions:
    """What every benchmark needs to know: model, precision, repeats, size, peers, where to write."""

    model: str = DEFAULT_MODEL
    dtypes: tuple[str, ...] = ("float32",)
    repeats: int = 3
    seed: int = 0
    scale: float = 1.0  # multiplies request counts (1.0: the sizes of issue 5)
    num_requests: int | None = None  # overrides the scaled request count of mixed, shared-prefix, serve
    requests_by_workload: dict[str, int] = field(default_factory=dict)  # bench all: e.g. {"mixed": 24, "serve": 8}
    static_dtypes: tuple[str, ...] | None = None  # dtypes that also run ember on static batches (None: all)
    peers: tuple[str, ...] = PEERS
    workload_file: Path | None = None  # replay this JSONL instead of generating
    save_workload: Path | None = None
    workload_dir: Path | None = None  # bench all: every generated workload is saved here as <name>.jsonl
    chunk_tokens: int = 256  # token budget per step with chunked prefill on (long-prefill)
    device: str = "cpu"  # where mixed's and batch1's ember engines run (DeviceConfig.device); the peers stay on the CPU
    kv_cache_dtype: str = "auto"  # batch1: not auto adds ember with this KV cache dtype beside the default cache
    hf_batch_size: int = 16
    llamacpp_slots: int = 16
    cache_dir: Path | None = None  # exported GGUFs for llama.cpp, transformers folders for vLLM
    vllm_python: Path | None = None  # the vLLM environment's Python (None: $EMBER_VLLM_PYTHON, else .venv-vllm)
    quant_also: tuple[str, ...] = ()  # bench all: further models whose quantization tables the quant section adds
    spec_sibling: SiblingPair | None = None  # bench all: a larger target and its smaller sibling for the spec section
    tick: Callable[[str], None] = field(default=lambda description: None)
    skipped: dict[str, str] = field(default_factory=dict)  # peer -> why it was not run

    def scaled(self, count: int) -> int:
        return max(1, round(count * self.scale))

    def requests(self, default: int, workload: str = "") -> int:
        return self.requests_by_workload.get(workload) or self.num_requests or self.scaled(default)


# -- shared plumbing -----------------------------------------------------------------------------


def model_path(model: str) -> Path:
    from ember.models.registry import resolve_model

    return resolve_model(model)


_SOURCES: dict[str, TokenSource] = {}


def token_source(model: str) -> TokenSource:
    """The corpus tokenized with the model's own tokenizer (once per process)."""
    if model not in _SOURCES:
        from ember.tokenizers import load

        _SOURCES[model] = TokenSource.from_tokenizer(load(model_path(model)))
    return _SOURCES[model]


def make_workload(options: BenchOptions, name: str, seed_offset: int = 0, **params) -> Workload:
    if options.workload_file is not None:
        workload = Workload.load(options.workload_file)
        if workload.name != name:
            raise ValueError(f"{options.workload_file} holds a {workload.name!r} workload, not {name!r}")
        return workload
    workload = workloads.build(name, token_source(options.model), seed=options.seed + seed_offset, **params)
    if options.save_workload is not None and seed_offset == 0:
        workload.save(options.save_workload)
    if options.workload_dir is not None and seed_offset == 0:
        workload.save(options.workload_dir / f"{name}.jsonl")
    return workload


def peer_unavailable(peer: str, vllm_python: Path | None = None) -> str | None:
    """None if the peer can run here, else the reason it cannot (and, for vLLM, how to make its environment)."""
    if peer == "hf":
        from ember.bench.hf_runner import hf_available

        return hf_available()
    if peer == "llamacpp":
        from ember.bench.llamacpp_runner import llamacpp_available

        return llamacpp_available()
    if peer == "vllm":
        from ember.bench.vllm_runner import vllm_available

        return vllm_available(vllm_python)
    return f"unknown peer {peer!r}"


def active_peers(options: BenchOptions) -> list[str]:
    active = []
    for peer in options.peers:
        reason = peer_unavailable(peer, options.vllm_python)
        if reason is None:
            active.append(peer)
        else:
            options.skipped[peer] = reason
    return active


def _tok_s(runs: list[RunResult]) -> dict:
    return spread([r.output_tok_s for r in runs]).to_dict()


def _run_record(run: RunResult) -> dict:
    """What the results file keeps of one run: its summary and its raw latencies (for CDF plots)."""
    record = run.summary()
    record["ttft_s"] = run.ttfts()
    record["itl_s"] = {role: run.itls(role) for role in sorted({r.role for r in run.requests})}
    return record


def _llamacpp_gguf(options: BenchOptions, dtype: str) -> Path:
    from ember.bench.gguf_export import export_gguf

    source = model_path(options.model)
    if not source.is_file():
        raise ValueError("the llama.cpp peer needs a GGUF model")
    if dtype == "auto":
        return source  # the checkpoint's own blocks, as ember runs them
    return export_gguf(source, _bench_cache(options) / f"{source.stem}.{ {'float32': 'F32', 'bfloat16': 'BF16'}[dtype] }.gguf", dtype)


def _vllm_folder(options: BenchOptions, dtype: str) -> Path:
    """The transformers folder vLLM loads: the model's own when it is one, else one made once from its GGUF at `dtype`."""
    from ember.bench.gguf_export import export_hf_folder

    source = model_path(options.model)
    if source.is_dir():
        return source
    return export_hf_folder(source, _bench_cache(options) / f"{source.stem}.hf-{dtype}", dtype)


def _bench_cache(options: BenchOptions) -> Path:
    """Where the peers' copies of the model's weights are written once and kept."""
    from ember.models.registry import ember_home

    return options.cache_dir or ember_home() / "bench"


# -- mixed ---------------------------------------------------------------------------------------


STATIC_BATCH_SIZE = 16


def static_batch_size(num_requests: int) -> int | None:
    """The static-batches lever's batch size: 16, or fewer so that at least two batches run.

    With every request in one batch, static and continuous batching run the same schedule and
    the row would measure nothing; a single request leaves no lever at all (None).
    """
    if num_requests < 2:
        return None
    return min(STATIC_BATCH_SIZE, -(-num_requests // 2))


def bench_mixed(options: BenchOptions) -> dict:
    """Output tokens/s of ember (continuous and static batches), HF, llama.cpp and vLLM, per dtype."""
    workload = make_workload(options, "mixed", num_requests=options.requests(64, "mixed"))
    path = model_path(options.model)
    static_size = static_batch_size(len(workload.requests))
    section = {"workload": workload.params, "num_requests": len(workload.requests), "static_batch_size": static_size,
               "output_tokens": workload.total_output_tokens, "prompt_tokens": workload.total_prompt_tokens, "dtype": {}}
    for dtype in options.dtypes:
        with contextlib.ExitStack() as closing:  # a peer's worker process ends with its dtype's runs
            runners = _mixed_runners(options, dtype, workload, path, static_size, closing)
            runs = _interleave(options, f"mixed {dtype}", runners)
        entry = {name: _mixed_record(rs) for name, rs in runs.items()}
        _drop_static_if_same_schedule(entry)
        ember = entry["ember"]["tok_s"]["median"]
        for peer in PEERS:
            entry[f"ratio_{peer}"] = ratio(ember, _get_median(entry, peer))
        entry["ratio_static"] = ratio(ember, _get_median(entry, "ember_static"))
        section["dtype"][dtype] = entry
    return section


def _mixed_runners(options: BenchOptions, dtype: str, workload: Workload, path: Path, static_size: int | None,
                   closing: contextlib.ExitStack) -> dict[str, Callable[[], RunResult]]:
    """One dtype's mixed engines: ember (continuous, and static batches where asked), the peers that can run here."""
    peers = active_peers(options)
    runners: dict[str, Callable[[], RunResult]] = {
        "ember": lambda: run_ember(options.model, dtype, workload, EmberSettings(device=options.device)),
    }
    if static_size and (options.static_dtypes is None or dtype in options.static_dtypes):
        runners["ember_static"] = lambda: run_ember(
            options.model, dtype, workload, EmberSettings(label=f"ember (static batches of {static_size})", static_batch_size=static_size,
                                                  device=options.device)
        )
    if "hf" in peers and dtype != "auto":  # transformers has no kernels for GGUF blocks
        runners["hf"] = _lazy_hf(path, dtype, options.hf_batch_size, workload)
    if "llamacpp" in peers:
        runners["llamacpp"] = _lazy_llamacpp(options, dtype, workload, options.llamacpp_slots)
    if "vllm" in peers and dtype != "auto":  # the peers compare at float precisions; auto is ember's quantized blocks
        runners["vllm"] = _lazy_vllm(options, dtype, workload, closing)
    return runners


def _mixed_record(runs: list[RunResult]) -> dict:
    """One engine's repeats: output tok/s, its settings, engine steps (ember), computed tokens and padding (HF)."""
    record = {"tok_s": _tok_s(runs), "settings": runs[0].extra.get("settings"), "runs": [_run_record(r) for r in runs]}
    if "num_steps" in runs[0].extra:
        record["num_steps"] = [r.extra["num_steps"] for r in runs]
    if "generated_tokens_incl_padding" in runs[0].extra:
        record["computed_tok_s"] = spread([r.extra["generated_tokens_incl_padding"] / r.wall_s for r in runs]).to_dict()
        record["output_padding_waste_pct"] = runs[0].extra["output_padding_waste_pct"]
        record["prompt_padding_waste_pct"] = runs[0].extra["prompt_padding_waste_pct"]
    return record


def _drop_static_if_same_schedule(entry: dict) -> None:
    """A static row whose engine ran exactly the continuous run's steps measured no lever: drop it, say why."""
    static, continuous = entry.get("ember_static"), entry["ember"]
    if static is None or static.get("num_steps") != continuous.get("num_steps"):
        return
    del entry["ember_static"]
    entry["static_dropped"] = (f"static batches ran the same {continuous['num_steps'][0]} engine steps as continuous "
                               "batching: the same schedule, so no lever to measure")


_HF_MODELS: dict[tuple[str, str], object] = {}


def _get_median(entry: dict, engine: str) -> float | None:
    return entry[engine]["tok_s"]["median"] if engine in entry else None


def _lazy_hf(path: Path, dtype: str, batch_size: int, workload: Workload, batch1: bool = False) -> Callable[[], RunResult]:
    """Load the HF model on first use, and keep it for every later run of this process at this dtype."""

    def run() -> RunResult:
        from ember.bench.hf_runner import HFRunner

        key = (str(path), dtype)
        if key not in _HF_MODELS:
            _HF_MODELS[key] = HFRunner(path, dtype)
        runner = _HF_MODELS[key]
        return runner.run_batch1(workload) if batch1 else runner.run(workload, batch_size)

    return run


def _lazy_llamacpp(options: BenchOptions, dtype: str, workload: Workload, slots: int) -> Callable[[], RunResult]:
    holder = {}

    def run() -> RunResult:
        from ember.bench.llamacpp_runner import LlamaCppRunner

        if "runner" not in holder:
            context = max(r.prompt_len + r.max_tokens for r in workload.requests)
            holder["runner"] = LlamaCppRunner(_llamacpp_gguf(options, dtype), dtype, slots=slots, slot_context=context)
        return holder["runner"].run(workload)

    return run


def _lazy_vllm(options: BenchOptions, dtype: str, workload: Workload, closing: contextlib.ExitStack,
               batch1: bool = False) -> Callable[[], RunResult]:
    """Start vLLM's worker on first use (its load takes minutes), keep it for every repeat, and end it with `closing`."""
    holder = {}

    def run() -> RunResult:
        from ember.bench.vllm_runner import VLLMRunner

        if "runner" not in holder:
            runner = VLLMRunner(_vllm_folder(options, dtype), dtype, options.vllm_python, seed=options.seed)
            holder["runner"] = closing.enter_context(contextlib.closing(runner))
        return holder["runner"].run(workload, batch1=batch1)

    return run


def _interleave(options: BenchOptions, title: str, runners: dict[str, Callable[[], RunResult]]) -> dict[str, list[RunResult]]:
    runs: dict[str, list[RunResult]] = {name: [] for name in runners}
    for repeat in range(options.repeats):
        for name, runner in runners.items():
            options.tick(f"{title}: {name} ({repeat + 1}/{options.repeats})")
            runs[name].append(runner())
    return runs


def planned_runs(options: BenchOptions, workload: str) -> int:
    """How many timed runs a benchmark makes (for the progress bar)."""
    peers = len([p for p in options.peers if p in PEERS])
    if workload == "mixed":
        static = len([d for d in options.dtypes if options.static_dtypes is None or d in options.static_dtypes])
        return ((1 + peers) * len(options.dtypes) + static) * options.repeats
    if workload == "batch1":
        return (1 + peers + (options.kv_cache_dtype != "auto")) * len(options.dtypes) * options.repeats
    if workload == "soak":
        return 1
    return {"shared-prefix": 2, "long-prefill": 2, "serve": 3, "roofline": 0}.get(workload, 0) * options.repeats


# -- batch1 -------------------------------------------------------------------------------------


def decode_tok_s(run: RunResult) -> float:
    """Single-stream decode rate: tokens after the first over the time after the first."""
    timing = run.requests[0]
    if timing.first_token is None or timing.finished is None or timing.output_tokens < 2:
        return 0.0
    return (timing.output_tokens - 1) / (timing.finished - timing.first_token)


def bench_batch1(options: BenchOptions) -> dict:
    """One 128-token prompt, 128 tokens out: decode tok/s of each engine, and ember's against the roofline.

    This machine's memory bandwidth moves by tens of percent within seconds (a VM sharing its host),
    so every comparison is paired in time: each repeat runs every dtype's engines one after the
    other (the bfloat16 / float32 ratio compares runs minutes apart no more), and the bandwidth is
    probed right before and right after each of ember's runs; ember's % of the roofline is the
    median over its runs of that run's decode rate against the mean of its own two probes."""
    workload = make_workload(options, "batch1")
    path = model_path(options.model)
    probes: dict[str, list[tuple[float, float]]] = {dtype: [] for dtype in options.dtypes}
    with contextlib.ExitStack() as closing:  # peers' worker processes end with the section's runs
        runners = {f"{dtype}/{name}": runner for dtype in options.dtypes
                   for name, runner in _batch1_runners(options, dtype, workload, path, probes[dtype], closing).items()}
        runs = _interleave(options, "batch1", runners)
    section: dict = {"workload": workload.params, "dtype": {}}
    for dtype in options.dtypes:
        own = {key.split("/", 1)[1]: rs for key, rs in runs.items() if key.split("/", 1)[0] == dtype}
        section["dtype"][dtype] = _batch1_entry(own, probes[dtype], path, dtype, workload)
    section["bandwidth_gb_s"] = median(gb_s for entry in section["dtype"].values() for gb_s in entry["bandwidth_gb_s"]["values"])
    if "auto" in section["dtype"] and "float32" in section["dtype"]:
        medians = {d: section["dtype"][d]["ember"]["decode_tok_s"]["median"] for d in ("auto", "float32")}
        section["ember_auto_vs_float32"] = ratio(medians["auto"], medians["float32"])
    return section


def _batch1_runners(options: BenchOptions, dtype: str, workload: Workload, path: Path, probes: list[tuple[float, float]],
                    closing: contextlib.ExitStack) -> dict[str, Callable[[], RunResult]]:
    """One dtype's batch1 engines: ember (its bandwidth probes appended to `probes`), its KV-cache variant, the peers."""
    peers = active_peers(options)
    runners: dict[str, Callable[[], RunResult]] = {
        "ember": _probed(lambda: run_ember(options.model, dtype, workload, EmberSettings(max_num_seqs=1, device=options.device)), probes),
    }
    if options.kv_cache_dtype != "auto":
        settings = EmberSettings(label=f"ember ({options.kv_cache_dtype} KV cache)", max_num_seqs=1, kv_cache_dtype=options.kv_cache_dtype,
                                 device=options.device)
        runners["ember_kv"] = lambda: run_ember(options.model, dtype, workload, settings)
    if "hf" in peers and dtype != "auto":  # transformers has no kernels for GGUF blocks
        runners["hf"] = _lazy_hf(path, dtype, 1, workload, batch1=True)
    if "llamacpp" in peers:
        runners["llamacpp"] = _lazy_llamacpp(options, dtype, workload, 1)
    if "vllm" in peers and dtype != "auto":
        runners["vllm"] = _lazy_vllm(options, dtype, workload, closing, batch1=True)
    return runners


def _batch1_entry(runs: dict[str, list[RunResult]], probes: list[tuple[float, float]], path: Path, dtype: str,
                  workload: Workload) -> dict:
    """One dtype's batch1 figures: every engine's decode rate, ember's against the roofline (paired per run), the ratios."""
    from ember.bench.roofline import decode_bytes

    step_bytes = decode_bytes(path, dtype, batch1_mean_context(workload))
    per_token = step_bytes.total
    bandwidths = [(before + after) / 2 for before, after in probes]
    entry: dict = {
        name: {"decode_tok_s": spread([decode_tok_s(r) for r in rs]).to_dict(), "tok_s": _tok_s(rs),
               "settings": rs[0].extra.get("settings"), "runs": [_run_record(r) for r in rs]}
        for name, rs in runs.items()
    }
    ember = entry["ember"]["decode_tok_s"]["median"]
    roofline_tok_s = median(bandwidths) * 1e9 / per_token
    paired = [100.0 * decode_tok_s(run) * per_token / (gb_s * 1e9) for run, gb_s in zip(runs["ember"], bandwidths, strict=True)]
    entry.update(bytes_per_token=per_token, decode_bytes=step_bytes.to_dict(), bandwidth_gb_s=spread(bandwidths).to_dict(),
                 probes_gb_s=[list(probe) for probe in probes], roofline_tok_s=roofline_tok_s,
                 roofline_pct=median(paired), roofline_pct_runs=paired)
    if "ember_kv" in entry:  # the same engine with the narrower KV cache, same run: decode speed-up
        entry["ratio_kv_cache"] = ratio(entry["ember_kv"]["decode_tok_s"]["median"], ember)
    for peer in PEERS:
        if peer in entry:
            entry[f"{peer}_roofline_pct"] = 100.0 * entry[peer]["decode_tok_s"]["median"] / roofline_tok_s
            entry[f"ratio_{peer}"] = ratio(ember, entry[peer]["decode_tok_s"]["median"])
    return entry


def _probed(runner: Callable[[], RunResult], probes: list[tuple[float, float]]) -> Callable[[], RunResult]:
    """`runner`, with the memory bandwidth (GB/s) probed right before and right after each call, appended to `probes`."""
    from ember.bench.roofline import measure_bandwidth

    def run() -> RunResult:
        before = measure_bandwidth().gb_per_s
        result = runner()
        probes.append((before, measure_bandwidth().gb_per_s))
        return result

    return run


# -- shared-prefix ----------------------------------------------------------------------------


def bench_shared_prefix(options: BenchOptions, dtype: str = "float32") -> dict:
    """Mean TTFT with prefix caching on vs off, and how much of the shared prefix was served from cache."""
    workload = make_workload(options, "shared-prefix", num_requests=options.requests(64, "shared-prefix"))
    prefix_len = workload.params.get("prefix_len", 1024)
    runners = {
        "on": lambda: run_ember(options.model, dtype, workload, EmberSettings(label="ember (prefix caching on)")),
        "off": lambda: run_ember(
            options.model, dtype, workload, EmberSettings(label="ember (prefix caching off)", enable_prefix_caching=False)
        ),
    }
    runs = _interleave(options, "shared-prefix", runners)
    section: dict = {"workload": workload.params, "num_requests": len(workload.requests), "dtype": dtype}
    for name, rs in runs.items():
        section[name] = {
            "mean_ttft_s": spread([mean(r.ttfts()) for r in rs]).to_dict(),
            "tok_s": _tok_s(rs),
            "prefix_reuse_pct": spread([_prefix_reuse_pct(r, prefix_len) for r in rs]).to_dict(),
            "runs": [_run_record(r) for r in rs],
        }
    section["ttft_ratio"] = ratio(section["off"]["mean_ttft_s"]["median"], section["on"]["mean_ttft_s"]["median"])
    section["prefix_reuse_pct"] = section["on"]["prefix_reuse_pct"]["median"]
    return section


def _prefix_reuse_pct(run: RunResult, prefix_len: int) -> float:
    """Share of all requests' shared-prefix tokens that came from the cache (the first request's cannot)."""
    reused = sum(min(t.num_cached_tokens, prefix_len) for t in run.requests)
    return 100.0 * reused / (prefix_len * len(run.requests))


# -- long-prefill -------------------------------------------------------------------------------


def bench_long_prefill(options: BenchOptions, dtype: str = "float32") -> dict:
    """Decoders' inter-token latency while long prompts arrive, chunked prefill on vs off."""
    # Only the decoders scale: with fewer than 4 long prompts their ITL spikes fall below 1% of the
    # samples and p99 stops seeing them.
    workload = make_workload(options, "long-prefill", num_decoders=options.scaled(16), num_long=4)
    longest = max(r.prompt_len + r.max_tokens for r in workload.requests)
    off_budget = max(4096, longest)
    runners = {
        "on": lambda: run_ember(
            options.model, dtype, workload,
            EmberSettings(label=f"ember (chunked prefill on, {options.chunk_tokens} tokens/step)", max_num_batched_tokens=options.chunk_tokens),
        ),
        "off": lambda: run_ember(
            options.model, dtype, workload,
            EmberSettings(label=f"ember (chunked prefill off, {off_budget} tokens/step)", enable_chunked_prefill=False, max_num_batched_tokens=off_budget),
        ),
    }
    runs = _interleave(options, "long-prefill", runners)
    section: dict = {"workload": workload.params, "dtype": dtype, "chunk_tokens": options.chunk_tokens, "off_budget_tokens": off_budget}
    for name, rs in runs.items():
        itl = [latency_summary(r.itls("decoder")) for r in rs]
        section[name] = {
            "label": rs[0].engine,
            "p50_itl_ms": spread([s["p50_ms"] for s in itl]).to_dict(),
            "p99_itl_ms": spread([s["p99_ms"] for s in itl]).to_dict(),
            "max_itl_ms": spread([s["max_ms"] for s in itl]).to_dict(),
            "long_ttft_ms": spread([1000 * mean(r.ttfts("long-prompt")) for r in rs]).to_dict(),
            "tok_s": _tok_s(rs),
            "runs": [_run_record(r) for r in rs],
        }
    section["p99_itl_ratio"] = ratio(section["off"]["p99_itl_ms"]["median"], section["on"]["p99_itl_ms"]["median"])
    section["p50_itl_ratio"] = ratio(section["off"]["p50_itl_ms"]["median"], section["on"]["p50_itl_ms"]["median"])
    return section


# -- serve ----------------------------------------------------------------------------------------


def bench_serve(
    options: BenchOptions,
    url: str | None = None,
    concurrency: int | None = 16,
    request_rate: float = float("inf"),
    slo=None,
    dtype: str = "float32",
    served_model: str | None = None,
    max_prompt: int = 512,
    max_output: int = 256,
) -> dict:
    """Load-test a running server at `url`, or start `ember serve` on a free port and test that.

    Against its own server (no `url`), each repeat also runs the same requests offline (`LLM`'s
    engine in this process, at the same concurrency) and one `batch1` request served alone and
    offline, so the report shows what the served path costs: served / offline output tok/s,
    served / offline batch-1 TPOT, and one whole 96-token answer end to end (`end_to_end_batch1`:
    admission, tokenization, the engine-process hop and the response included), same run.
    With "vllm" among the peers (and no `url`), `vllm serve` of the same weights is started beside it and each
    repeat sends it the same requests, and the batch1 request alone, right after ember's (`section["vllm"]`).
    """
    import asyncio

    from ember.bench.serve import SLO, ember_server, run_load

    if max_prompt < 1 or max_output < 2:
        raise ValueError("--max-prompt-tokens must be at least 1 and --max-output-tokens at least 2 (a TPOT needs two tokens)")
    slo = slo or SLO()
    num_requests = options.requests(64, "serve")
    server = contextlib.nullcontext(url) if url else ember_server(options.model, dtype)
    label = url or f"ember serve ({dtype})"
    compares_offline = url is None
    lengths = {"max_prompt": max_prompt, "max_output": max_output}
    batch1_lengths = {"prompt_len": min(128, max_prompt), "output_len": min(128, max_output)}
    batch1 = make_workload(options, "batch1", **batch1_lengths) if compares_offline else None
    options.tick(f"serve: starting {label}")
    runs, offline, served_batch1, offline_batch1 = [], [], [], []
    served_e2e, offline_e2e = [], []
    peer_runs: dict[str, list[RunResult]] = {}
    with contextlib.ExitStack() as servers:
        base_url = servers.enter_context(server)
        peer_urls = _serve_peers(options, dtype, servers) if compares_offline else {}
        for repeat in range(options.repeats):
            # A new seed per repeat, so a server's prefix cache cannot serve a repeat's prompts.
            workload = make_workload(options, "serve", seed_offset=repeat, num_requests=num_requests, request_rate=request_rate, **lengths)
            options.tick(f"serve: {label} ({repeat + 1}/{options.repeats})")
            runs.append(asyncio.run(run_load(base_url, workload, served_model, concurrency, label=label)))
            if not compares_offline:
                continue
            for peer, (peer_url, peer_model) in peer_urls.items():
                options.tick(f"serve: the same requests and batch1 on {peer} serve ({repeat + 1}/{options.repeats})")
                peer_runs.setdefault(peer, []).append(asyncio.run(run_load(peer_url, workload, peer_model, concurrency, label=f"{peer} serve")))
                peer_runs.setdefault(f"{peer}/batch1", []).append(asyncio.run(run_load(peer_url, batch1, peer_model, 1, label=f"{peer} serve")))
            options.tick(f"serve: the same requests offline ({repeat + 1}/{options.repeats})")
            offline.append(run_ember(options.model, dtype, workload, _offline_settings(concurrency, len(workload.requests))))
            options.tick(f"serve: batch1 served and offline ({repeat + 1}/{options.repeats})")
            served_batch1.append(asyncio.run(run_load(base_url, batch1, served_model, 1, label=label)))
            offline_batch1.append(run_ember(options.model, dtype, batch1, EmberSettings(label="ember offline (batch 1)", max_num_seqs=1)))
            options.tick(f"serve: one whole answer served and offline, end to end ({repeat + 1}/{options.repeats})")
            served_s, offline_s = end_to_end_batch1(base_url, options.model, dtype, served_model)
            served_e2e.append(E2E_OUTPUT_TOKENS / served_s)
            offline_e2e.append(E2E_OUTPUT_TOKENS / offline_s)
    section = {
        "target": label,
        "num_requests": num_requests,
        "max_prompt_tokens": max_prompt,
        "max_output_tokens": max_output,
        "concurrency": concurrency,
        "request_rate": None if request_rate == float("inf") else request_rate,
        **_served_figures(runs, slo),
    }
    section["slo"] = section["runs"][0]["slo"]
    for peer in peer_urls:
        section[peer] = _served_figures(peer_runs[peer], slo)
        section[peer]["batch1_tpot_ms"] = spread([1000 * mean_tpot_s(r) for r in peer_runs[f"{peer}/batch1"]]).to_dict()
        section[f"ratio_{peer}"] = ratio(section["tok_s"]["median"], section[peer]["tok_s"]["median"])
    if compares_offline:
        section["vs_offline"] = served_vs_offline(runs, offline, served_batch1, offline_batch1)
        section["vs_offline"]["e2e_batch1_tok_s"] = {"served": spread(served_e2e).to_dict(), "offline": spread(offline_e2e).to_dict()}
        section["vs_offline"]["e2e_batch1_ratio"] = ratio(spread(served_e2e).median, spread(offline_e2e).median)
    return section


def _serve_peers(options: BenchOptions, dtype: str, servers: contextlib.ExitStack) -> dict[str, tuple[str, str]]:
    """The peers' servers of the serve bench, started and entered into `servers`: peer -> (base URL, model name)."""
    if "vllm" not in active_peers(options):
        return {}
    from ember.bench.vllm_runner import VLLM_SERVED_NAME, vllm_server

    options.tick("serve: starting vllm serve (its load takes minutes)")
    base_url = servers.enter_context(vllm_server(_vllm_folder(options, dtype), dtype, options.vllm_python))
    return {"vllm": (base_url, VLLM_SERVED_NAME)}


def _served_figures(runs: list[RunResult], slo) -> dict:
    """One server's repeats under load: output tok/s, TTFT, TPOT, ITL, goodput (median, min, max), errors, the runs."""
    from ember.bench.serve import serve_summary

    summaries = [serve_summary(r, slo) for r in runs]
    return {
        "tok_s": _tok_s(runs),
        "mean_ttft_ms": spread([s["ttft"].get("mean_ms", 0.0) for s in summaries]).to_dict(),
        "p99_ttft_ms": spread([s["ttft"].get("p99_ms", 0.0) for s in summaries]).to_dict(),
        "mean_tpot_ms": spread([s["tpot"].get("mean_ms", 0.0) for s in summaries]).to_dict(),
        "p99_itl_ms": spread([s["itl"].get("p99_ms", 0.0) for s in summaries]).to_dict(),
        "goodput_req_s": spread([s["goodput_req_s"] for s in summaries]).to_dict(),
        "errors": sum(s["errors"] for s in summaries),
        "runs": [dict(s, ttft_s=r.ttfts(), itl_s={"main": r.itls()}) for s, r in zip(summaries, runs, strict=True)],
    }


E2E_PROMPT = "Once upon a time"
E2E_OUTPUT_TOKENS = 96
E2E_ATTEMPTS = 3  # alternating pairs per repeat; the best of each side counts (as the held-out check took it)


def end_to_end_batch1(base_url: str, model: str, dtype: str, served_model: str | None) -> tuple[float, float]:
    """Best wall seconds of one whole (non-streamed) 96-token answer to a short text prompt: through the server's
    /v1/completions, and through `LLM.generate` in this process; what a user waits for, tokenization and all."""
    import httpx

    from ember.engine.sampling_params import SamplingParams
    from ember.llm import LLM

    llm = LLM(model, dtype=dtype, loaded=loaded_weights(model, dtype))
    params = SamplingParams(max_tokens=E2E_OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)
    body = {"prompt": E2E_PROMPT, "max_tokens": E2E_OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0}
    if served_model is not None:
        body["model"] = served_model
    served_s, offline_s = [], []
    with httpx.Client(base_url=base_url, timeout=600) as client:
        client.post("/v1/completions", json=body).raise_for_status()  # both warm before timing
        llm.generate([E2E_PROMPT], params)
        for _ in range(E2E_ATTEMPTS):
            started = time.perf_counter()
            answer = client.post("/v1/completions", json=body)
            served_s.append(time.perf_counter() - started)
            answer.raise_for_status()
            if answer.json()["usage"]["completion_tokens"] != E2E_OUTPUT_TOKENS:
                raise RuntimeError(f"the server answered {answer.json()['usage']} for a {E2E_OUTPUT_TOKENS}-token request")
            started = time.perf_counter()
            llm.generate([E2E_PROMPT], params)
            offline_s.append(time.perf_counter() - started)
    return min(served_s), min(offline_s)


def _offline_settings(concurrency: int | None, num_requests: int) -> EmberSettings:
    """The offline engine of the served comparison: as many sequences at once as the load keeps in flight."""
    seats = min(concurrency or num_requests, SchedulerConfig().max_num_seqs)
    return EmberSettings(label=f"ember offline ({seats} sequences at once)", max_num_seqs=seats)


def served_vs_offline(served: list[RunResult], offline: list[RunResult], served_batch1: list[RunResult],
                      offline_batch1: list[RunResult]) -> dict:
    """Served against offline, same requests: output tok/s of the load and TPOT of one request alone."""
    tok_s = {"served": _tok_s(served), "offline": _tok_s(offline)}
    tpot_ms = {
        "served": spread([1000 * mean_tpot_s(r) for r in served_batch1]).to_dict(),
        "offline": spread([1000 * mean_tpot_s(r) for r in offline_batch1]).to_dict(),
    }
    return {
        "offline_settings": offline[0].extra.get("settings"),
        "tok_s": tok_s,
        "tok_s_ratio": ratio(tok_s["served"]["median"], tok_s["offline"]["median"]),
        "batch1_tpot_ms": tpot_ms,
        "batch1_tpot_ratio": ratio(tpot_ms["served"]["median"], tpot_ms["offline"]["median"]),
    }


def mean_tpot_s(run: RunResult) -> float:
    """Mean time per output token after the first, over the run's requests that made two or more."""
    tpots = [t.tpot_s for t in run.requests if t.tpot_s is not None]
    return mean(tpots) if tpots else 0.0


# -- roofline ---------------------------------------------------------------------------------


def batch1_mean_context(workload: Workload) -> int:
    """Cached tokens of the batch1 request at the middle of its decode: its prompt and half its output."""
    request = workload.requests[0]
    return request.prompt_len + request.max_tokens // 2


def bench_roofline(options: BenchOptions) -> dict:
    from ember.bench.roofline import decode_bytes, measure_bandwidth, measure_matmul

    bandwidths = []
    for repeat in range(options.repeats):
        options.tick(f"roofline: memory bandwidth ({repeat + 1}/{options.repeats})")
        bandwidths.append(measure_bandwidth())
    options.tick("roofline: matmul throughput")
    matmul = {dtype: measure_matmul(dtype) for dtype in ("float32", "bfloat16")}
    path = model_path(options.model)
    gb_s = spread([b.gb_per_s for b in bandwidths]).to_dict()
    context = batch1_mean_context(make_workload(options, "batch1"))
    step_bytes = {dtype: decode_bytes(path, dtype, context) for dtype in ("float32", "bfloat16")}
    per_token = {dtype: b.total for dtype, b in step_bytes.items()}
    return {
        "bandwidth_gb_s": gb_s,
        "method": bandwidths[0].method,
        "threads": bandwidths[0].threads,
        "array_bytes": bandwidths[0].array_bytes,
        "matmul_gflops": matmul,
        "bytes_per_token": per_token,
        "decode_bytes": {dtype: b.to_dict() for dtype, b in step_bytes.items()},
        "roofline_tok_s": {dtype: gb_s["median"] * 1e9 / b for dtype, b in per_token.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# -- soak -------------------------------------------------------------------------------------

SOAK_REQUESTS = 10_000
SOAK_SERVER_ARGS = ("--num-kv-blocks", "48", "--block-size", "16", "--max-model-len", "512")


def bench_soak(
    options: BenchOptions,
    url: str | None = None,
    concurrency: int = 32,
    cancel_fraction: float = 0.1,
    max_tokens: int = 16,
    server_args: tuple[str, ...] = SOAK_SERVER_ARGS,
    served_model: str | None = None,
) -> dict:
    """Many mixed requests against `url`, or against `ember serve` started with a KV pool small
    enough to force preemption: lost requests, 5xx, free blocks and server memory (ember.bench.soak)."""
    import asyncio
    import contextlib

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ember.bench.serve import ember_server
    from ember.bench.soak import SoakSettings, run_soak

    settings = SoakSettings(num_requests=options.requests(SOAK_REQUESTS, "soak"), concurrency=concurrency,
                            cancel_fraction=cancel_fraction, max_tokens=max_tokens, seed=options.seed, served_model=served_model)
    label = url or f"ember serve {' '.join(server_args)}"
    options.tick(f"soak: {settings.num_requests} requests against {label}")
    server = contextlib.nullcontext(url) if url else ember_server(options.model, options.dtypes[0], server_args)
    with server as base_url, Progress(TextColumn("[bold]soak"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                      TimeElapsedColumn()) as progress:
        task = progress.add_task("soak", total=settings.num_requests)
        result = asyncio.run(run_soak(base_url, settings, on_done=lambda: progress.advance(task)))
    return {"target": label, "model": options.model, **result.as_dict()}
