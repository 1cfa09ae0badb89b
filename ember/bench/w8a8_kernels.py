"""W8A8 product paths timed on one model's layer shapes: the compiled kernel against torch's.

Each shape (token rows m, layer in -> out) times the whole W8A8 product (per-token rounding,
integer sums, scaling) through the compiled kernel (ember.quant.int8.w8a8_kernels), the plain-torch
path (exact float32 GEMM on codes in column chunks: the fallback) and `torch._int_mm` (int32
accumulation), plus torch's float32 `F.linear` on the dequantized weight for scale, in the same
run: medians of `repeats` timed groups. The W8A8 layer picks the fastest path it has from this
table: the compiled kernel at every shape measured here, else the plain-torch path.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ember.bench.formatting import fmt, fmt_ratio

DEFAULT_ROWS = (1, 4, 8, 16, 64)
COLUMNS = ("layer", "rows", "in -> out", "compiled", "plain torch", "torch _int_mm", "float32 F.linear", "plain torch / compiled",
           "_int_mm / compiled")


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(in, out) of the four products of a Llama-family block of `model` (a GGUF file or an HF folder)."""
    from ember.gguf_file import GGUFFile
    from ember.models.gguf_loader import is_gguf_file, read_gguf_config
    from ember.models.hf_loader import read_hf_config

    path = Path(model)
    config = read_gguf_config(GGUFFile.open(path)) if is_gguf_file(path) else read_hf_config(path)
    q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inner = config.hidden_size, config.intermediate_size
    return {"qkv": (hidden, q_width + 2 * kv_width), "o": (q_width, hidden), "gate_up": (hidden, 2 * inner), "down": (inner, hidden)}


def bench_w8a8_kernels(shapes: dict[str, tuple[int, int]], rows: tuple[int, ...] = DEFAULT_ROWS, repeats: int = 5) -> list[dict]:
    """One row per (layer, m): microseconds per product of each path, and each torch path's time over the compiled one's."""
    from ember.quant.int8.channel import quantize_weight, w8a8_linear_torch
    from ember.quant.int8.w8a8_kernels import load_w8a8_kernels

    kernels = load_w8a8_kernels()
    results = []
    generator = torch.Generator().manual_seed(0)
    for name, (cols, out) in shapes.items():
        weight = quantize_weight(torch.randn(out, cols, generator=generator))
        dense = weight.dequantize()
        for m in rows:
            x = torch.randn(m, cols, generator=generator)
            timed = {
                "compiled_us": _median_us(functools.partial(kernels.linear, x, weight, None), repeats) if kernels is not None else None,
                "torch_us": _median_us(functools.partial(w8a8_linear_torch, x, weight, None), repeats),
                "int_mm_us": _median_us(functools.partial(_w8a8_int_mm, x, weight), repeats),
                "float32_us": _median_us(functools.partial(F.linear, x, dense), repeats),
            }
            compiled = timed["compiled_us"]
            results.append({"layer": name, "rows": m, "in": cols, "out": out, **timed,
                            "torch_over_compiled": timed["torch_us"] / compiled if compiled else None,
                            "int_mm_over_compiled": timed["int_mm_us"] / compiled if compiled else None})
    return results


def _w8a8_int_mm(x: torch.Tensor, weight) -> torch.Tensor:
    """The W8A8 product with `torch._int_mm` for the integer sums."""
    from ember.quant.int8.channel import int8_products_int_mm, quantize_tokens, scale_products

    x_codes, x_scales = quantize_tokens(x)
    return scale_products(int8_products_int_mm(x_codes, weight.codes), x_scales, weight.scales, None)


def _median_us(call: Callable[[], object], repeats: int, group_s: float = 0.02) -> float:
    """Median microseconds per call over `repeats` groups of about `group_s` seconds each (at least one call)."""
    start = time.perf_counter()
    call()  # warm-up (first-use builds, allocator), which also sizes the groups
    calls_per_group = max(1, min(50, int(group_s / max(time.perf_counter() - start, 1e-6))))
    groups = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls_per_group):
            call()
        groups.append((time.perf_counter() - start) / calls_per_group * 1e6)
    return statistics.median(groups)


def table_cells(row: dict) -> list[str]:
    """One row of the timings as table cells (COLUMNS): microseconds and ratios."""
    return [row["layer"], str(row["rows"]), f"{row['in']} -> {row['out']}", fmt(row["compiled_us"]), fmt(row["torch_us"]),
            fmt(row["int_mm_us"]), fmt(row["float32_us"]), fmt_ratio(row["torch_over_compiled"]), fmt_ratio(row["int_mm_over_compiled"])]
