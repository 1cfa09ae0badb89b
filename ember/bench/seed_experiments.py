"""The experiments of `ember bench seed`: one function per experiment, each returning plain JSON with a
`figures` entry per claim it measures ({"value", "detail", "modelled", "reason"}).

Most reuse a benchmark that already exists (mixed, spec, quant, roofline, tokenizers, parallel, the KV
planner); the ones the seed needs and `bench all` lacks are here: max-length KV allocation against
ember's paged blocks, an unfused attention path as FlashAttention's "before", random models of one
size with MHA, GQA-8, MQA and MLA, and GPT-3's vocabularies against GPT-4o's on Korean and Hindi.
Claims about GPUs are measured on the GPU when torch sees one, else modelled from the figures
measured here and the published bandwidth and FLOPs of `GPU` (each such figure says so).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ember.bench.stats import ratio

# Published dense figures of an H100 SXM (NVIDIA's datasheet): what a GPU claim is modelled on.
GPU = {"name": "H100 SXM (published)", "bandwidth_b_s": 3.35e12, "bf16_flop_s": 989e12, "fp8_flop_s": 1979e12}
LLAMA2_7B_PARAMETERS = 6.74e9
FUSED_ATTENTION_EFFICIENCY = 0.5  # share of peak FLOPs FlashAttention-2 reports reaching (50-73% on A100)
Q4_K_M_BITS_PER_WEIGHT = 4.84  # llama.cpp's published size of Llama-2-7B in Q4_K_M (4.08 GB for 6.74B weights)


@dataclass
class SeedContext:
    """What every experiment is given: the model, how big to run, and where plots go."""

    model: str = "smollm2-135m-instruct"
    scale: float = 1.0
    repeats: int = 3
    seed: int = 0
    plots_dir: Path = Path("benchmarks/plots")
    tick: Callable[[str], None] = field(default=lambda description: None)

    def scaled(self, count: int, floor: int = 1) -> int:
        return max(floor, round(count * self.scale))

    def bench_options(self, **changes):
        """suite.BenchOptions for a reused benchmark, no peers unless asked."""
        from ember.bench.suite import BenchOptions

        options = BenchOptions(model=self.model, dtypes=("float32",), repeats=self.repeats, seed=self.seed, scale=self.scale,
                               peers=(), tick=self.tick)
        return replace(options, **changes)


def figure(value: float | None, detail: str, modelled: bool = False, reason: str | None = None) -> dict:
    """One claim's figure as the report keeps it (`reason`: why it is None, or what it is modelled on)."""
    return {"value": None if value is None else round(float(value), 4), "detail": detail, "modelled": modelled, "reason": reason}


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# -- batching: continuous vs static batches, ember vs HF transformers --------------------------------


def run_batching(ctx: SeedContext) -> dict:
    """`ember bench mixed` (with the static-batches lever, the HF peer, and vLLM's CPU build where its environment is
    present: the paged-attention claim's own subject), and a sweep of the batch size (one size below
    --scale 0.5, two below 1, four at 1): continuous batching with at most B sequences against static batches of B, same
    workload."""
    from ember.bench import suite
    from ember.bench.ember_runner import EmberSettings, run_ember

    options = ctx.bench_options(peers=("hf", "vllm"), num_requests=ctx.scaled(64, floor=8))
    mixed = suite.bench_mixed(options)
    entry = mixed["dtype"]["float32"]
    static = entry.get("ember_static", {}).get("tok_s", {}).get("median")
    workload = suite.make_workload(options, "mixed", num_requests=options.num_requests)
    sweep = {}
    for batch in (2,) if ctx.scale < 0.5 else (2, 8) if ctx.scale < 1 else (2, 4, 8, 16):
        runners = {
            "continuous": lambda b=batch: run_ember(ctx.model, "float32", workload, EmberSettings(max_num_seqs=b)),
            "static": lambda b=batch: run_ember(ctx.model, "float32", workload, EmberSettings(static_batch_size=b, max_num_seqs=b)),
        }
        runs = suite._interleave(options, f"seed batching sweep, batch {batch}", runners)
        sweep[str(batch)] = {name: statistics.median(r.output_tok_s for r in rs) for name, rs in runs.items()}
    if static:  # the bench's own pair: static batches of its size against continuous batching with no cap
        sweep.setdefault(str(mixed["static_batch_size"]), {"continuous": entry["ember"]["tok_s"]["median"], "static": static})
    plot = _plot_batching(sweep, entry, ctx.plots_dir / "seed_batching.png")
    hf_reason = options.skipped.get("hf")
    return {
        "num_requests": mixed["num_requests"], "workload": mixed["workload"], "static_batch_size": mixed["static_batch_size"],
        "tok_s": {name: entry[name]["tok_s"]["median"] for name in ("ember", "ember_static", "hf", "vllm") if name in entry},
        "sweep_tok_s": sweep, "plots": [plot],
        "figures": {
            "continuous-batching": figure(
                entry.get("ratio_static"),
                f"ember's output tok/s with continuous batching / with static batches of {mixed['static_batch_size']} "
                f"(same engine, kernels and paged cache), {mixed['num_requests']} mixed requests, float32"
                + (f"; vs HF transformers' padded static batches: {entry['ratio_hf']:.2f}x" if entry.get("ratio_hf") else ""),
                reason=None if static else entry.get("static_dropped")),
            "paged-vs-hf": figure(
                entry.get("ratio_hf"),
                f"ember (paged KV, continuous batching) / HF transformers generate (batches of {options.hf_batch_size}), "
                f"output tok/s, {mixed['num_requests']} mixed requests, float32" + _vllm_vs_hf(entry, options.skipped.get("vllm")), reason=hf_reason),
        },
    }


def _vllm_vs_hf(entry: dict, skipped: str | None) -> str:
    """What vLLM itself (the claim's subject, its CPU build) measured against HF in the same run, or why it did not run."""
    if skipped is not None:
        return f"; vLLM itself not run: {skipped}"
    if "vllm" not in entry or "hf" not in entry:
        return ""
    return f"; vLLM's CPU build / HF transformers, same run: {entry['vllm']['tok_s']['median'] / entry['hf']['tok_s']['median']:.2f}x"


def _plot_batching(sweep: dict, entry: dict, path: Path) -> str:
    plt = _pyplot()
    sizes = [int(b) for b in sweep]
    figure_, axes = plt.subplots(figsize=(6, 4))
    sizes.sort()
    axes.plot(sizes, [sweep[str(b)]["continuous"] for b in sizes], marker="o",
              label="continuous batching (ember; at the largest size, no cap)")
    axes.plot(sizes, [sweep[str(b)]["static"] for b in sizes], marker="s", label="static batches (ember)")
    if "hf" in entry:
        axes.axhline(entry["hf"]["tok_s"]["median"], color="gray", linestyle="--", label="HF transformers (batches of 16)")
    if "vllm" in entry:
        axes.axhline(entry["vllm"]["tok_s"]["median"], color="tab:red", linestyle=":", label="vLLM CPU build (its defaults)")
    axes.set_xlabel("batch size (most sequences at once)")
    axes.set_ylabel("output tok/s")
    axes.set_xscale("log", base=2)
    axes.set_title("Static vs continuous batching, mixed workload")
    axes.legend()
    return _save(figure_, path)


# -- KV waste: max-length allocation vs paged blocks ----------------------------------------------------


def kv_waste_pct(num_tokens: int, allocated_slots: int) -> float:
    """Share of allocated KV slots that hold no token."""
    return 100.0 * (1.0 - num_tokens / allocated_slots)


def paged_slots(num_tokens: int, block_size: int) -> int:
    """Slots ember's KV cache manager holds for one sequence of `num_tokens` (whole blocks, asked of the real manager)."""
    from ember.kv.cache_manager import KVCacheManager

    manager = KVCacheManager(num_blocks=-(-num_tokens // block_size) + 1, block_size=block_size, enable_prefix_caching=False)
    if manager.allocate_slots("seq", list(range(num_tokens)), 0, num_tokens) is None:
        raise RuntimeError(f"the cache manager refused {num_tokens} tokens with room for them")
    return manager.block_table("seq").num_held_blocks * block_size


def run_kv_waste(ctx: SeedContext, max_length: int = 2048, block_size: int = 16) -> dict:
    """KV slots wasted by one request generating n tokens: reserved for `max_length` up front, against ember's paged blocks."""
    lengths = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1500, max_length]
    rows = [{"tokens": n, "max_length_waste_pct": kv_waste_pct(n, max_length),
             "paged_waste_pct": kv_waste_pct(n, paged_slots(n, block_size))} for n in lengths]
    at_50 = next(row for row in rows if row["tokens"] == 50)
    plot = _plot_kv_waste(rows, max_length, block_size, ctx.plots_dir / "seed_kv_waste.png")
    return {"max_length": max_length, "block_size": block_size, "rows": rows, "plots": [plot], "figures": {
        "kv-waste": figure(at_50["max_length_waste_pct"],
                           f"50 tokens in a {max_length}-slot reservation; ember's paged cache (blocks of {block_size}, its "
                           f"KVCacheManager) holds {paged_slots(50, block_size)} slots for them: "
                           f"{at_50['paged_waste_pct']:.1f}% waste, never more than one partly filled block")}}


def _plot_kv_waste(rows: list[dict], max_length: int, block_size: int, path: Path) -> str:
    plt = _pyplot()
    figure_, axes = plt.subplots(figsize=(6, 4))
    tokens = [row["tokens"] for row in rows]
    axes.plot(tokens, [row["max_length_waste_pct"] for row in rows], marker="o", label=f"reserved for {max_length} tokens")
    axes.plot(tokens, [row["paged_waste_pct"] for row in rows], marker="s", label=f"paged blocks of {block_size} (ember)")
    axes.set_xscale("log")
    axes.set_xlabel("tokens the request generated")
    axes.set_ylabel("% of its KV slots wasted")
    axes.set_title("KV waste: max-length allocation vs paged blocks")
    axes.legend()
    return _save(figure_, path)


# -- prefix caching over the shared share of the prompt ------------------------------------------------


def run_prefix(ctx: SeedContext, prompt_len: int = 512, shares: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)) -> dict:
    """Mean TTFT with prefix caching on vs off, on prompts of `prompt_len` tokens of which a share is common to all."""
    from ember.bench import suite, workloads
    from ember.bench.ember_runner import EmberSettings, run_ember

    options = ctx.bench_options()
    num_requests = ctx.scaled(16, floor=4)
    rows = []
    for share in shares:
        prefix_len = round(share * prompt_len)
        workload = workloads.build("shared-prefix", suite.token_source(ctx.model), seed=ctx.seed, num_requests=num_requests,
                                   prefix_len=prefix_len, question_len=prompt_len - prefix_len, output_len=4)
        runners = {"on": lambda w=workload: run_ember(ctx.model, "float32", w, EmberSettings()),
                   "off": lambda w=workload: run_ember(ctx.model, "float32", w, EmberSettings(enable_prefix_caching=False))}
        runs = suite._interleave(options, f"seed prefix caching, {share:.0%} shared", runners)
        ttft = {name: statistics.median(statistics.mean(r.ttfts()) for r in rs) for name, rs in runs.items()}
        cached = statistics.median(r.extra["cached_prompt_tokens"] for r in runs["on"])
        rows.append({"share": share, "prefix_len": prefix_len, "mean_ttft_s": ttft, "saved_pct": 100.0 * (1 - ttft["on"] / ttft["off"]),
                     "cached_prompt_pct": 100.0 * cached / (num_requests * prompt_len)})
    middle = min(rows, key=lambda row: abs(row["share"] - 0.75))
    plot = _plot_prefix(rows, ctx.plots_dir / "seed_prefix.png")
    return {"prompt_len": prompt_len, "num_requests": num_requests, "rows": rows, "plots": [plot], "figures": {
        "prefix-caching": figure(middle["saved_pct"],
                                 f"mean TTFT saved by prefix caching, {num_requests} requests of {prompt_len} prompt tokens of which "
                                 f"{middle['share']:.0%} are shared; over the sweep: "
                                 + ", ".join(f"{row['share']:.0%} shared -> {row['saved_pct']:.0f}%" for row in rows)
                                 + f" (the first of the {num_requests} requests computes the whole prefix, so at most "
                                 f"{(num_requests - 1) / num_requests:.0%} of the shared tokens can be saved; more requests, "
                                 "larger --scale, come closer to the shared share)")}}


def _plot_prefix(rows: list[dict], path: Path) -> str:
    plt = _pyplot()
    figure_, axes = plt.subplots(figsize=(6, 4))
    shares = [100 * row["share"] for row in rows]
    axes.plot(shares, [row["saved_pct"] for row in rows], marker="o", label="mean TTFT saved (measured)")
    axes.plot(shares, [row["cached_prompt_pct"] for row in rows], marker="s", label="prompt tokens served from cache")
    axes.axhspan(50, 90, color="orange", alpha=0.15, label="the seed's 50-90%")
    axes.set_xlabel("% of each prompt shared by every request")
    axes.set_ylabel("%")
    axes.set_title("Prefix caching: savings over the shared share")
    axes.legend()
    return _save(figure_, path)


# -- attention: fused (FlashAttention-style) vs unfused --------------------------------------------------


def unfused_attention(q, k, v):
    """Attention as written before FlashAttention: the whole score matrix materialized, masked, softmaxed, multiplied."""
    import torch

    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    length = q.shape[-2]
    mask = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def fused_attention(q, k, v):
    """ember's prefill attention: torch's fused scaled_dot_product_attention (a flash kernel on CPU and GPU)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def run_attention(ctx: SeedContext, num_heads: int = 9, head_dim: int = 64) -> dict:
    """Prefill attention time, fused vs unfused, over the sequence length (SmolLM2's 9 heads of 64), and the bytes each holds."""
    import torch

    device = "cuda" if has_gpu() else "cpu"
    lengths = (256, 512, 1024) if ctx.scale < 0.5 else (256, 512, 1024, 2048)
    rows = []
    for length in lengths:
        ctx.tick(f"seed attention: fused vs unfused at {length} tokens")
        q, k, v = (torch.randn(1, num_heads, length, head_dim, device=device) for _ in range(3))
        torch.testing.assert_close(fused_attention(q, k, v), unfused_attention(q, k, v), atol=2e-4, rtol=2e-4)
        times = {"fused": [], "unfused": []}
        for _ in range(max(3, ctx.repeats)):
            for name, attend in (("fused", fused_attention), ("unfused", unfused_attention)):
                times[name].append(_time(lambda a=attend, inputs=(q, k, v): a(*inputs), device))
        kv_bytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        rows.append({"tokens": length, "fused_ms": 1e3 * statistics.median(times["fused"]),
                     "unfused_ms": 1e3 * statistics.median(times["unfused"]), "kv_bytes": kv_bytes,
                     "score_bytes": num_heads * length * length * q.element_size()})
    for row in rows:
        row["speedup"] = row["unfused_ms"] / row["fused_ms"]
    longest = rows[-1]
    plot = _plot_attention(rows, ctx.plots_dir / "seed_attention.png")
    measured = f"measured on {device} at {longest['tokens']} tokens: unfused {longest['unfused_ms']:.1f} ms, fused {longest['fused_ms']:.1f} ms ({longest['speedup']:.2f}x)"
    speed = figure(longest["speedup"], measured) if device == "cuda" else figure(
        modelled_flash_speedup(), f"modelled on the {GPU['name']} for 32 heads of 128 at 4096 tokens (bf16): the unfused path "
        f"writes and re-reads the score matrix through HBM, the fused one is bound by its FLOPs; {measured}",
        modelled=True, reason="no GPU here: published bandwidth and FLOPs")
    return {"device": device, "num_heads": num_heads, "head_dim": head_dim, "rows": rows, "plots": [plot], "figures": {
        "flash-speed": speed,
        "flash-memory": figure(longest["kv_bytes"] / longest["kv_bytes"],
                               f"both paths read the same K and V ({longest['kv_bytes'] / 1e6:.1f} MB at {longest['tokens']} tokens): "
                               f"FlashAttention leaves the KV cache as it is; what it never holds is the N x N score matrix "
                               f"({longest['score_bytes'] / 1e6:.0f} MB here, {num_heads} heads, float32), so its memory saving "
                               "is of activations and grows with N^2, not a halving of the KV cache")}}


def modelled_flash_speedup(tokens: int = 4096, heads: int = 32, head_dim: int = 128) -> float:
    """Unfused / fused attention time on `GPU`: causal QK^T and PV at FlashAttention's share of peak FLOPs; the unfused
    path's two matmuls are bound by the larger of those FLOPs and moving the bf16
    score matrix through memory four times (written, read and written by softmax, read by PV)."""
    flops = 2 * 2 * tokens * tokens * head_dim * heads / 2  # two matmuls, causal half
    score_bytes = tokens * tokens * heads * 2
    compute_s = flops / (GPU["bf16_flop_s"] * FUSED_ATTENTION_EFFICIENCY)
    unfused_s = max(compute_s / 2, score_bytes / GPU["bandwidth_b_s"]) * 2 + 2 * score_bytes / GPU["bandwidth_b_s"]
    return unfused_s / compute_s


def _plot_attention(rows: list[dict], path: Path) -> str:
    plt = _pyplot()
    figure_, axes = plt.subplots(figsize=(6, 4))
    tokens = [row["tokens"] for row in rows]
    axes.plot(tokens, [row["unfused_ms"] for row in rows], marker="o", label="unfused (scores materialized)")
    axes.plot(tokens, [row["fused_ms"] for row in rows], marker="s", label="fused (scaled_dot_product_attention)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("sequence length (tokens)")
    axes.set_ylabel("ms per causal attention (all heads)")
    axes.set_title("Attention: fused vs unfused")
    axes.legend()
    return _save(figure_, path)


def _time(call: Callable[[], object], device: str) -> float:
    import torch

    call()  # warm
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    call()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure_, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure_.tight_layout()
    figure_.savefig(path, dpi=110)
    _pyplot().close(figure_)
    return str(path)


# -- speculative decoding -----------------------------------------------------------------------------


def run_spec(ctx: SeedContext) -> dict:
    """`ember bench spec` at batch 1 (n-gram and a 4-bit self-draft; Medusa and EAGLE heads too at --scale 1):
    decode speed-up and tokens per verification step, per workload; the plot sets them against the acceptance rate."""
    from ember.bench.spec import SpecBenchOptions, bench_spec

    methods = ("ngram", "draft", "medusa", "eagle") if ctx.scale >= 1 else ("ngram", "draft")
    spec = SpecBenchOptions(methods=methods, draft_model=ctx.model, draft_dtype="auto", num_prompts=ctx.scaled(3), output_len=128,
                            batch_sizes=(), mixed_requests=0)
    section = bench_spec(ctx.bench_options(), spec)
    points = [{"workload": workload, "method": method, "decode_ratio": entry[method]["decode_ratio"],
               "acceptance_rate": entry[method]["acceptance_rate"], "tokens_per_step": 1 + entry[method]["mean_accepted_length"]}
              for workload, entry in section["batch1"].items() for method in methods]
    by_method = {method: statistics.median(p["decode_ratio"] for p in points if p["method"] == method) for method in methods}
    best = max(by_method, key=by_method.get)
    best_points = [p for p in points if p["method"] == best]
    tokens_per_step = statistics.median(p["tokens_per_step"] for p in best_points)
    caps = section["num_speculative_tokens"]
    plot = _plot_spec(points, caps, ctx.plots_dir / "seed_spec.png")
    listing = "; ".join(f"{m}: {r:.2f}x" for m, r in by_method.items())
    return {"methods": list(methods), "points": points, "by_method": by_method, "best": best, "plots": [plot],
            "num_speculative_tokens": caps, "figures": {
                "spec-speedup": figure(by_method[best], f"batch-1 decode tok/s with / without speculation, median over the "
                                       f"{len(section['batch1'])} workloads ({', '.join(section['batch1'])}), best proposer "
                                       f"{best} (of {listing}; per workload: "
                                       + ", ".join(f"{p['workload']} {p['decode_ratio']:.2f}x" for p in best_points)
                                       + "), SmolLM2 float32"),
                "spec-accepted": figure(tokens_per_step, f"tokens per verification step (accepted drafts + 1) of {best}, median "
                                        f"over workloads, draft length cap {caps[best]}: "
                                        + ", ".join(f"{p['workload']} {p['tokens_per_step']:.2f}" for p in best_points))}}


def speculative_speedup(acceptance_rate: float, draft_length: int, draft_cost: float) -> float:
    """Expected speed-up of speculative decoding (Leviathan et al.): tokens per step over the step's cost, a draft
    token costing `draft_cost` target steps; acceptance independent per token."""
    if acceptance_rate >= 1:
        tokens = draft_length + 1
    else:
        tokens = (1 - acceptance_rate ** (draft_length + 1)) / (1 - acceptance_rate)
    return tokens / (1 + draft_length * draft_cost)


def _plot_spec(points: list[dict], caps: dict, path: Path) -> str:
    plt = _pyplot()
    figure_, axes = plt.subplots(figsize=(6, 4))
    rates = [i / 50 for i in range(50)]
    for cost in (0.0, 0.1):
        axes.plot(rates, [speculative_speedup(r, 4, cost) for r in rates], linestyle="--",
                  label=f"model, 4 drafts, draft cost {cost:g} of a step")
    for method in dict.fromkeys(p["method"] for p in points):
        mine = [p for p in points if p["method"] == method]
        axes.scatter([p["acceptance_rate"] for p in mine], [p["decode_ratio"] for p in mine], label=f"{method} (cap {caps[method]})")
    axes.axhspan(2, 3, color="orange", alpha=0.15, label="the seed's 2-3x")
    axes.set_xlabel("acceptance rate")
    axes.set_ylabel("decode speed-up")
    axes.set_title("Speculative decoding: speed-up over acceptance rate")
    axes.legend(fontsize=7)
    return _save(figure_, path)


# -- quantization ---------------------------------------------------------------------------------------


def run_quant(ctx: SeedContext) -> dict:
    """`ember bench quant` on SmolLM2 (calibrated on tinyshakespeare, perplexity on botchan): bytes per parameter,
    perplexity change and batch-1 decode speed of 4-bit and FP8 against the float model."""
    from ember.bench.feature_benches import QUANT_CALIB_FILE, QUANT_EVAL_FILE
    from ember.bench.quant import (
        MIN_CALIB_TOKENS,
        MIN_EVAL_WINDOWS,
        QuantBenchOptions,
        bench_quant,
        plot_quant,
    )
    from ember.bench.workloads import find_corpus_dir

    corpus = find_corpus_dir()
    if corpus is None:
        raise FileNotFoundError("the quant experiment needs the shared corpora (../shared/corpus or $EMBER_SHARED/corpus)")
    methods = ("rtn4", "awq4", "gptq4", "fp8") if ctx.scale >= 0.5 else ("rtn4", "awq4", "fp8")
    options = QuantBenchOptions(model=ctx.model, calib=corpus / QUANT_CALIB_FILE, eval_file=corpus / QUANT_EVAL_FILE, methods=methods,
                                eval_windows=max(MIN_EVAL_WINDOWS, ctx.scaled(8)), calib_tokens=max(MIN_CALIB_TOKENS, ctx.scaled(4096)))
    section = bench_quant(options, tick=ctx.tick, time_kernels=False)
    rows = {row["name"].split(" ")[0]: row for row in section["rows"]}
    float_row = section["rows"][0]
    four_bit = [row for name, row in rows.items() if name in ("rtn4", "awq4", "gptq4")]
    fp8 = rows.get("fp8")
    plot = str(plot_quant(section, ctx.plots_dir / "seed_quant.png"))
    best4 = min(four_bit, key=lambda row: row["bytes_per_parameter"]) if four_bit else None
    figures = {
        "int4-memory": figure(None if best4 is None else 2.0 / best4["bytes_per_parameter"],
                              "fp16's 2 bytes per parameter / the 4-bit row's bytes in memory (scales and zero points included), "
                              + ("; ".join(f"{row['name']}: {row['bytes_per_parameter']:.3f} B/param" for row in four_bit))),
        "int4-throughput": _gpu_decode_figure(best4, float_row, "4-bit"),
        "fp8-memory": figure(None if fp8 is None else 2.0 / fp8["bytes_per_parameter"],
                             "fp16's 2 bytes per parameter / the FP8 row's" + ("" if fp8 is None else f" ({fp8['bytes_per_parameter']:.3f})")),
        "fp8-quality": figure(None if fp8 is None else fp8["ppl_vs_float_pct"],
                              f"perplexity change of FP8 weights over float32 on botchan ({section['eval_tokens']} tokens)"
                              + ("" if fp8 is None else f", +- {fp8['ppl_vs_float_se_pct'] or 0:.2f} points (standard error over windows)")),
        "fp8-throughput": _gpu_decode_figure(fp8, float_row, "FP8"),
        "q4km-memory": figure(16 / Q4_K_M_BITS_PER_WEIGHT,
                              f"16 bits / Q4_K_M's {Q4_K_M_BITS_PER_WEIGHT} bits per weight (llama.cpp's published Llama-2-7B size); "
                              f"no Q4_K_M checkpoint is at hand (SmolLM2's GGUF is Q4_1: {rows.get('checkpoint', float_row)['bytes_per_parameter']:.3f} "
                              "B/param in memory, embeddings Q8_0)", modelled=True, reason="the format's published bits per weight"),
        "q4km-perplexity": figure(None, "4-bit rows measured here on SmolLM2-135M (a small model loses more): "
                                  + "; ".join(f"{row['name']}: {row['ppl_vs_float_pct']:+.1f}%" for row in four_bit),
                                  reason="every Q4_K_M model obtainable here ships without its float weights (SmolLM2's float here "
                                  "is its Q4_1 GGUF dequantized), so there is no float perplexity to compare with"),
    }
    return {"methods": list(methods), "eval_tokens": section["eval_tokens"], "rows": section["rows"], "not_run": section["not_run"],
            "plots": [plot], "figures": figures}


def _gpu_decode_figure(row: dict | None, float_row: dict, label: str) -> dict:
    """Batch-1 decode speed-up of a quantized row on `GPU`: decode there is bound by the bytes read (the memory-bound
    row models it at >99%), so fp16's bytes over the row's; this CPU's measured ratio to float32 beside it."""
    if row is None:
        return figure(None, f"no {label} row", reason=f"the {label} method did not run")
    cpu = ratio(row["decode_tok_s"], float_row["decode_tok_s"])
    cpu_text = f"{cpu:.2f}x" if cpu is not None else "unmeasured"
    return figure(2.0 / row["bytes_per_parameter"], f"modelled on the {GPU['name']}: batch-1 decode reads every weight once per token, "
                  f"so fp16 bytes / {label} bytes ({row['bytes_per_parameter']:.3f} B/param measured here); on this CPU {row['name']} "
                  f"decodes at {cpu_text} the float32 model's rate", modelled=True, reason="no GPU here: decode modelled as memory-bound")


# -- attention variants: MHA, GQA-8, MQA, MLA on random models of one size -----------------------------------


VARIANT_SHAPE = dict(vocab_size=49152, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=32,
                     max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=10000.0)


def save_variant_model(variant: str, folder: Path) -> Path:
    """A random model of VARIANT_SHAPE (32 heads of 32) with `variant` attention, saved as a transformers folder
    (kept: the same folder is reused by later runs). MLA follows DeepSeek-V2's proportions: a latent of 4 head dims, a
    rope key of half a head; all its layers dense."""
    import torch
    import transformers

    if (folder / "config.json").is_file():
        return folder
    heads = VARIANT_SHAPE["num_attention_heads"]
    head_dim = VARIANT_SHAPE["hidden_size"] // heads
    torch.manual_seed(0)
    if variant == "MLA":
        config = transformers.DeepseekV2Config(**VARIANT_SHAPE, num_key_value_heads=heads, kv_lora_rank=4 * head_dim, q_lora_rank=None,
                                               qk_nope_head_dim=head_dim, qk_rope_head_dim=head_dim // 2, v_head_dim=head_dim,
                                               first_k_dense_replace=VARIANT_SHAPE["num_hidden_layers"], n_routed_experts=4,
                                               num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1)
        model = transformers.DeepseekV2ForCausalLM(config)
    else:
        kv_heads = {"MHA": heads, "GQA-8": 8, "MQA": 1}[variant]
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**VARIANT_SHAPE, num_key_value_heads=kv_heads))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def run_attention_variants(ctx: SeedContext) -> dict:
    """Per variant: KV bytes per token the engine allocates (float32) and batch decode tok/s at a long context."""
    import torch

    from ember.bench import suite, workloads
    from ember.bench.ember_runner import EmberSettings, loaded_weights, run_ember
    from ember.kv.tensors import KVCacheTensors
    from ember.models.registry import ember_home

    prompt_len, output_len, batch = (1024, 32, 4) if ctx.scale >= 0.5 else (512, 16, 4)
    source = suite.token_source(ctx.model)
    rng = random.Random(ctx.seed)
    requests = [workloads.BenchRequest(f"variant-{i}", source.take(rng, prompt_len), output_len) for i in range(batch)]
    workload = workloads.Workload("variants", ctx.seed, requests, {"prompt_len": prompt_len, "output_len": output_len, "batch": batch},
                                  source.description)
    options = ctx.bench_options()
    rows = {}
    folders = {v: save_variant_model(v, ember_home() / "bench" / "seed-attention-variants" / v) for v in ("MHA", "GQA-8", "MQA", "MLA")}
    for variant, folder in folders.items():
        ctx.tick(f"seed attention variants: {variant} KV bytes")
        model = loaded_weights(str(folder), "float32").model
        caches = KVCacheTensors(model, num_blocks=64, block_size=16, dtype=torch.float32)
        rows[variant] = {"kv_bytes_per_token": caches.num_bytes // (64 * 16)}
    runners = {v: (lambda f=folders[v]: run_ember(str(f), "float32", workload, EmberSettings(max_num_seqs=batch))) for v in folders}
    runs = suite._interleave(options, "seed attention variants: decode", runners)
    for variant, rs in runs.items():
        rows[variant]["decode_tok_s"] = statistics.median(_batch_decode_tok_s(r) for r in rs)
    mha = rows["MHA"]["kv_bytes_per_token"]
    plot = _plot_variants(rows, ctx.plots_dir / "seed_attention_variants.png")
    shape = f"{VARIANT_SHAPE['num_hidden_layers']} layers, 32 heads of 32, hidden {VARIANT_SHAPE['hidden_size']}"
    speed = ", ".join(f"{v} {row['decode_tok_s']:.1f}" for v, row in rows.items())
    return {"shape": shape, "prompt_len": prompt_len, "output_len": output_len, "batch": batch, "rows": rows, "plots": [plot], "figures": {
        "gqa-cache": figure(mha / rows["GQA-8"]["kv_bytes_per_token"],
                            f"KV bytes/token the engine allocates, MHA / GQA-8, random models of one size ({shape}); it is "
                            f"heads / 8: 4x for a 32-head model (Llama-3-8B), 8x for a 64-head one (Llama-2-70B); decode tok/s "
                            f"at batch {batch}, {prompt_len}-token prompts: {speed}"),
        "mla-cache": figure(100.0 * (1 - rows["MLA"]["kv_bytes_per_token"] / mha),
                            f"KV bytes/token saved by MLA (latent {4 * 32} + rope key 16 per layer) against MHA of the same size "
                            f"({mha} -> {rows['MLA']['kv_bytes_per_token']} bytes/token, float32)")}}


def _batch_decode_tok_s(run) -> float:
    """Tokens after each request's first over the time from the last first token to the last finish (a batch in lockstep)."""
    first = max(t.first_token for t in run.requests)
    finished = max(t.finished for t in run.requests)
    return sum(t.output_tokens - 1 for t in run.requests) / (finished - first)


def _plot_variants(rows: dict, path: Path) -> str:
    plt = _pyplot()
    figure_, (left, right) = plt.subplots(1, 2, figsize=(8, 3.6))
    names = list(rows)
    left.bar(names, [rows[n]["kv_bytes_per_token"] / 1024 for n in names])
    left.set_ylabel("KV KiB per token (float32)")
    left.set_yscale("log")
    right.bar(names, [rows[n]["decode_tok_s"] for n in names], color="tab:orange")
    right.set_ylabel("decode tok/s (batch, long prompts)")
    figure_.suptitle("Attention variants on random models of one size")
    return _save(figure_, path)


# -- the memory wall ------------------------------------------------------------------------------------------


def memory_share_pct(weight_and_kv_bytes: float, flops: float, bandwidth_b_s: float, flop_s: float) -> float:
    """Share of a decode step spent moving bytes, when moving them and computing do not overlap (the seed's reading)."""
    memory_s, compute_s = weight_and_kv_bytes / bandwidth_b_s, flops / flop_s
    return 100.0 * memory_s / (memory_s + compute_s)


def run_roofline(ctx: SeedContext) -> dict:
    """`ember bench roofline` and `batch1`: this machine's bandwidth and matmul rate, SmolLM2's bytes per token, and
    how close ember's batch-1 decode comes to the memory roofline; the same arithmetic on `GPU` for Llama-2-7B."""
    from ember.bench import suite

    options = ctx.bench_options()
    roofline = suite.bench_roofline(options)
    batch1 = suite.bench_batch1(options)["dtype"]["float32"]
    decode = roofline["decode_bytes"]["float32"]
    parameters = decode["weight_bytes"] / 4
    cpu_share = memory_share_pct(decode["total"], 2 * parameters, roofline["bandwidth_gb_s"]["median"] * 1e9,
                                 roofline["matmul_gflops"]["float32"] * 1e9)
    kv_4k = 2 * 32 * 4096 * 2 * 4096
    gpu_share = memory_share_pct(LLAMA2_7B_PARAMETERS * 2 + kv_4k, 2 * LLAMA2_7B_PARAMETERS, GPU["bandwidth_b_s"], GPU["bf16_flop_s"])
    return {"bandwidth_gb_s": roofline["bandwidth_gb_s"]["median"], "matmul_gflops": roofline["matmul_gflops"],
            "bytes_per_token": decode["total"], "cpu_memory_share_pct": cpu_share, "roofline_pct": batch1["roofline_pct"],
            "decode_tok_s": batch1["ember"]["decode_tok_s"]["median"], "plots": [], "figures": {
                "memory-bound": figure(gpu_share, f"modelled on the {GPU['name']}: Llama-2-7B bf16 at batch 1 and 4k context reads "
                                       f"{(LLAMA2_7B_PARAMETERS * 2 + kv_4k) / 1e9:.1f} GB for {2 * LLAMA2_7B_PARAMETERS / 1e9:.1f} GFLOP per token; "
                                       f"measured here on SmolLM2 float32: {roofline['bandwidth_gb_s']['median']:.1f} GB/s, "
                                       f"{roofline['matmul_gflops']['float32']:.0f} GFLOP/s, {decode['total'] / 1e6:.0f} MB/token -> "
                                       f"{cpu_share:.1f}% of a step is memory by the same arithmetic, and ember decodes at "
                                       f"{batch1['roofline_pct']:.0f}% of the memory roofline",
                                       modelled=True, reason="no GPU here: published bandwidth and FLOPs")}}


# -- tokenizers ------------------------------------------------------------------------------------------------


def run_tokenizer_languages(ctx: SeedContext) -> dict:
    """Tokens of the same Firefox messages in Korean, Hindi and English under GPT-3's vocabularies (r50k_base, p50k_base)
    and GPT-4o's (o200k_base), encoded by ember's tiktoken loader (parity with tiktoken is tested elsewhere)."""
    from ember.bench.tokenizer_languages import firefox_l10n_dir, load_parallel_texts
    from ember.bench.workloads import find_corpus_dir
    from ember.tokenizers.compare import measure_costs, plot_costs
    from ember.tokenizers.formats.tiktoken_files import load_tiktoken

    corpus = find_corpus_dir()
    try:
        texts = load_parallel_texts(firefox_l10n_dir())
    except FileNotFoundError as missing:
        return _unmeasurable(("tokenizer-korean", "tokenizer-hindi"), str(missing))
    folder = corpus.parent / "tokenizers" / "tiktoken" if corpus else None
    names = ("r50k_base", "p50k_base", "o200k_base")
    if folder is None or not all((folder / f"{n}.tiktoken").is_file() for n in names):
        return _unmeasurable(("tokenizer-korean", "tokenizer-hindi"), "the shared tiktoken rank files (../shared/tokenizers/tiktoken) are absent")
    ctx.tick("seed tokenizers: Korean and Hindi under GPT-3 and GPT-4o vocabularies")
    cells = measure_costs({n: load_tiktoken(folder / f"{n}.tiktoken", n) for n in names}, texts)
    tokens = {(c.tokenizer, c.language): c.tokens for c in cells}
    path = ctx.plots_dir / "seed_tokenizer_languages.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_costs(cells, path)

    def language_figure(language: str) -> dict:
        return figure(tokens[("r50k_base", language)] / tokens[("o200k_base", language)],
                      f"tokens of the same {language} text (Firefox's messages, {texts[language].count(chr(10)) + 1} lines): "
                      f"r50k_base (GPT-3) {tokens[('r50k_base', language)]}, p50k_base {tokens[('p50k_base', language)]}, "
                      f"o200k_base (GPT-4o) {tokens[('o200k_base', language)]}; English: r50k / o200k = "
                      f"{tokens[('r50k_base', 'english')] / tokens[('o200k_base', 'english')]:.2f}x")

    return {"tokens": {f"{t}/{lang}": n for (t, lang), n in tokens.items()}, "plots": [str(path)],
            "figures": {"tokenizer-korean": language_figure("korean"), "tokenizer-hindi": language_figure("hindi")}}


def run_tokenizer_speed(ctx: SeedContext) -> dict:
    """`ember bench tokenizers` without its pre-tokenizer and language parts: tiktoken and HF tokenizers (built from the same
    cl100k_base ranks, parity checked) encoding the same mixed documents, one thread, MB/s of CPU time."""
    from ember.bench.tokenizers import run_tokenizer_bench
    from ember.bench.workloads import find_corpus_dir

    corpus = find_corpus_dir()
    if corpus is None:
        return _unmeasurable(("tiktoken-speed",), "the shared corpora and rank files (../shared) are absent")
    ctx.tick("seed tokenizers: tiktoken vs HF tokenizers")
    report = run_tokenizer_bench(corpus.parent, encodings=("cl100k_base",), text_bytes=int(max(0.25, 2 * ctx.scale) * 1e6),
                                 repeats=ctx.repeats, seed=ctx.seed, languages=False, pre_tokenizers=False)
    results = report["results"]["cl100k_base"]
    return {"results": results, "parity": report["parity"], "workload": report["workload"], "plots": [], "figures": {
        "tiktoken-speed": figure(results["tiktoken"]["mb_per_s"] / results["tokenizers"]["mb_per_s"],
                                 f"tiktoken {results['tiktoken']['mb_per_s']:.2f} MB/s / HF tokenizers {results['tokenizers']['mb_per_s']:.2f} "
                                 f"MB/s, cl100k_base, {report['workload']['megabytes']} MB of mixed text, one thread (ember cold: "
                                 f"{results['ember_cold']['mb_per_s']:.2f} MB/s); token-for-token mismatches: {report['parity']['cl100k_base']}")}}


def _unmeasurable(claim_ids: tuple[str, ...], reason: str) -> dict:
    return {"plots": [], "figures": {claim: figure(None, "", reason=reason) for claim in claim_ids}}


# -- parallelism -----------------------------------------------------------------------------------------------


def run_parallel(ctx: SeedContext) -> dict:
    """`ember bench parallel`, tensor and pipeline at 2 ranks: collectives per forward and bytes per token, counted."""
    from ember.bench.feature_benches import parallel_config
    from ember.bench.parallel import run_parallel_bench
    from ember.bench.roofline import model_config
    from ember.bench.suite import model_path

    config = model_config(model_path(ctx.model))
    modes = {}
    for mode in ("tensor", "pipeline"):
        ctx.tick(f"seed parallel: {mode} x2")
        modes[mode] = run_parallel_bench(ctx.model, parallel_config(mode, 2), 1, 32, 8, 1, ctx.seed)
    tensor, pipeline = modes["tensor"], modes["pipeline"]
    activation_row = config.hidden_size * 4
    keep = ("collective", "calls_per_forward", "bytes_per_token_counted", "bytes_per_token_formula", "formula", "speedup")
    return {"modes": {m: {k: r.get(k) for k in keep} for m, r in modes.items()}, "num_layers": config.num_layers,
            "hidden_size": config.hidden_size, "plots": [], "figures": {
                "tp-allreduce": figure(tensor["calls_per_forward"] / config.num_layers,
                                       f"{tensor['calls_per_forward']} all-reduces counted per forward of SmolLM2 ({config.num_layers} layers) "
                                       "at TP=2: two per layer (attention's output projection, the MLP's down projection) and one for "
                                       "the vocabulary-parallel embedding"),
                "pp-activations": figure(pipeline["bytes_per_token_counted"] / activation_row,
                                         f"bytes sent between the 2 stages per token, counted: {pipeline['bytes_per_token_counted']:.0f} "
                                         f"= {pipeline['bytes_per_token_counted'] / activation_row:g} x one float32 activation row "
                                         f"(hidden {config.hidden_size} x 4 bytes); no weights or KV cross")}}


# -- KV size formula ----------------------------------------------------------------------------------------------


def run_kv_formula(ctx: SeedContext) -> dict:
    """`ember kv llama-2-7b --context 4096 --dtype float16`: the KV planner's bytes for the seed's example."""
    from ember.models.family_registry import config_from_hf
    from ember.models.kv_planner import KNOWN_SHAPES, plan

    result = plan("llama-2-7b", config_from_hf(KNOWN_SHAPES["llama-2-7b"]), "float16", 4096)
    return {"bytes_per_token": result.bytes_per_token, "bytes_per_sequence": result.bytes_per_sequence, "plots": [], "figures": {
        "kv-llama2-7b": figure(result.bytes_per_sequence / 1e9,
                               f"2 (K, V) x 32 layers x 32 heads x 128 dims x 2 bytes = {result.bytes_per_token} bytes/token, x 4096 "
                               f"tokens = {result.bytes_per_sequence / 1e9:.3f} GB ({result.bytes_per_sequence / 2**30:.2f} GiB), ember's KV planner")}}


EXPERIMENT_RUNNERS: dict[str, Callable[[SeedContext], dict]] = {
    "batching": run_batching, "kv-waste": run_kv_waste, "prefix": run_prefix, "attention": run_attention, "spec": run_spec,
    "quant": run_quant, "attention-variants": run_attention_variants, "roofline": run_roofline,
    "tokenizer-languages": run_tokenizer_languages, "tokenizer-speed": run_tokenizer_speed, "parallel": run_parallel,
    "kv-formula": run_kv_formula,
}
