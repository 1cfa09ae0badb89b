"""W8A8 product paths timed on one model's layer shapes: the compiled kernel against torch's `_int_mm`.

Each shape (token rows m, layer in -> out) times the whole W8A8 product (per-token rounding,
int32 sums, scaling) through the compiled kernel (ember.quant.w8a8_kernels) and through the
plain-torch path (`torch._int_mm`), plus torch's float32 `F.linear` on the dequantized weight
for scale, in the same run: medians of `repeats` timed groups. The W8A8 layer sends up to
`COMPILED_MAX_ROWS` rows to the compiled kernel; this table is the evidence for that limit.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

DEFAULT_ROWS = (1, 4, 8, 16, 64)


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(in, out) of the four products of a Llama-family block of `model` (a GGUF file or an HF folder)."""
    from gguf import GGUFReader

    from ember.models.gguf_loader import is_gguf_file, read_gguf_config
    from ember.models.hf_loader import read_hf_config

    path = Path(model)
    config = read_gguf_config(GGUFReader(str(path))) if is_gguf_file(path) else read_hf_config(path)
    q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inner = config.hidden_size, config.intermediate_size
    return {"qkv": (hidden, q_width + 2 * kv_width), "o": (q_width, hidden), "gate_up": (hidden, 2 * inner), "down": (inner, hidden)}


def bench_w8a8_kernels(shapes: dict[str, tuple[int, int]], rows: tuple[int, ...] = DEFAULT_ROWS, repeats: int = 5) -> list[dict]:
    """One row per (layer, m): microseconds per product of each path, and int_mm / compiled."""
    from ember.quant.int8_channel import quantize_weight, w8a8_linear_torch
    from ember.quant.w8a8_kernels import load_w8a8_kernels

    kernels = load_w8a8_kernels()
    results = []
    generator = torch.Generator().manual_seed(0)
    for name, (cols, out) in shapes.items():
        weight = quantize_weight(torch.randn(out, cols, generator=generator))
        dense = weight.dequantize()
        for m in rows:
            x = torch.randn(m, cols, generator=generator)
            int_mm_us = _median_us(functools.partial(w8a8_linear_torch, x, weight, None), repeats)
            compiled_us = _median_us(functools.partial(kernels.linear, x, weight, None), repeats) if kernels is not None else None
            float_us = _median_us(functools.partial(F.linear, x, dense), repeats)
            results.append({
                "layer": name, "rows": m, "in": cols, "out": out, "compiled_us": compiled_us, "int_mm_us": int_mm_us,
                "float32_us": float_us, "int_mm_over_compiled": int_mm_us / compiled_us if compiled_us else None,
            })
    return results


def _median_us(call: Callable[[], object], repeats: int, calls_per_group: int = 20) -> float:
    call()  # warm-up (first-use builds, allocator)
    groups = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls_per_group):
            call()
        groups.append((time.perf_counter() - start) / calls_per_group * 1e6)
    return statistics.median(groups)
