"""The Python half of scripts/gpu-check.sh: the CUDA tests, a kernel benchmark, one table.

Run by the shell script once it has found a CUDA device (and pytest). The tests run in a pytest
subprocess (compiled Triton, not the interpreter); the benchmark times each Triton kernel against
the torch code the same layer ran on CUDA before it (ember's own fallback) and against torch's
fused peer (SDPA / F.rms_norm) on the same tensors, in this one process run, median of repeats.
Shapes are Qwen2.5-1.5B's and SmolLM2-135M's attention and hidden sizes, bfloat16.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ember.layers import attention
from ember.layers.attention import AttentionMetadata
from ember.layers.cpu_attention import PagedBatch
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.layers.triton_kernels import load_triton_kernels

ROOT = Path(__file__).resolve().parent.parent
# The test files with Triton parity tests and `cuda` tests. A new `cuda` test file goes here too: collecting the
# whole suite would import modules whose packages (fastapi, gguf, hypothesis) the GPU image lacks.
TEST_PATHS = ("tests/layers/test_triton_kernels.py", "tests/layers/test_device_dispatch.py")
BLOCK_SIZE = 16


@dataclass(frozen=True)
class AttentionShape:
    """One model's attention: query heads, KV heads, head size."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int


SHAPES = (AttentionShape("qwen2.5-1.5b", 12, 2, 128, 1536), AttentionShape("smollm2-135m", 9, 3, 64, 576))


def run_tests(junit_path: Path, timeout_s: float) -> tuple[list[list[str]], bool]:
    """Run the test files in a pytest subprocess; rows per file (passed, failed, skipped, seconds) and all passed."""
    command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-o", "addopts=",
               f"--junitxml={junit_path}", *TEST_PATHS]
    print("$", " ".join(command), flush=True)
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    completed = subprocess.run(command, cwd=ROOT, env=environment, timeout=timeout_s)
    if not junit_path.exists():
        return [["pytest", "-", "-", "-", f"exit {completed.returncode}, no report"]], False
    per_file: dict[str, list[float]] = {}
    for case in ElementTree.parse(junit_path).iter("testcase"):
        tally = per_file.setdefault(case.get("classname", "?"), [0, 0, 0, 0.0])
        outcome = 1 if case.find("failure") is not None or case.find("error") is not None else (
            2 if case.find("skipped") is not None else 0)
        tally[outcome] += 1
        tally[3] += float(case.get("time", 0))
    rows = [[name, str(p), str(f), str(s), f"{t:.1f}"] for name, (p, f, s, t) in sorted(per_file.items())]
    return rows, completed.returncode == 0


def median_ms(function: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and spread (max - min) in milliseconds of `repeats` timed calls after two warm-up calls."""
    for _ in range(2):
        function()
    times = []
    for _ in range(repeats):
        _synchronize()
        start = time.perf_counter()
        function()
        _synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), max(times) - min(times)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _attention_step(device: torch.device, shape: AttentionShape, context_lens: list[int], query_counts: list[int]):
    """A step over a bfloat16 cache: (query, key, value, cache) and its metadata (the PagedBatch on the CPU, as the
    runner builds it today: the dispatch moves it)."""
    tables, slots = [], []
    num_blocks = sum(-(-c // BLOCK_SIZE) for c in context_lens)
    pool = torch.randperm(num_blocks).tolist()
    for context, count in zip(context_lens, query_counts, strict=True):
        table = [pool.pop() for _ in range(-(-context // BLOCK_SIZE))]
        tables.append(table)
        slots.extend(table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(context - count, context))
    width = max(len(t) for t in tables)
    starts = [sum(query_counts[:i]) for i in range(len(query_counts))]
    paged = PagedBatch(
        block_tables=torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32),
        query_starts=torch.tensor(starts, dtype=torch.int32),
        query_counts=torch.tensor(query_counts, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
    )
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, shape.num_kv_heads, shape.head_dim, device=device).bfloat16()
    tokens = sum(query_counts)
    query = torch.randn(tokens, shape.num_heads, shape.head_dim, device=device).bfloat16()
    key, value = (torch.randn(tokens, shape.num_kv_heads, shape.head_dim, device=device).bfloat16() for _ in range(2))
    slot_mapping = torch.tensor(slots, device=device)
    metadata = AttentionMetadata(slot_mapping=slot_mapping, prefills=[], decode_rows=None, paged=paged)
    return (query, key, value, cache), metadata


def bench_decode(device: torch.device, shape: AttentionShape, batch: int, context: int, repeats: int) -> list[str]:
    """Paged decode (new keys written, then attention) against torch reading the same blocks (gather through the
    block tables, then SDPA) and against SDPA over the keys laid out dense (what a FlashAttention-style kernel reads,
    no block tables, no write)."""
    tensors, metadata = _attention_step(device, shape, [context] * batch, [1] * batch)
    scale = shape.head_dim ** -0.5
    ours, spread = median_ms(lambda: attention.paged_attention(*tensors, metadata, scale), repeats)
    query, cache = tensors[0].unsqueeze(2), tensors[3]  # query [B, H, 1, D]
    tables = metadata.paged.block_tables.to(device, torch.long)

    def gathered() -> torch.Tensor:
        blocks = cache[:, tables].flatten(2, 3).transpose(2, 3)  # [2, B, H_kv, L, D]
        return F.scaled_dot_product_attention(query, blocks[0], blocks[1], scale=scale, enable_gqa=True)

    gather, _ = median_ms(gathered, repeats)
    dense = torch.randn(batch, shape.num_kv_heads, context, shape.head_dim, device=device).bfloat16()
    sdpa, _ = median_ms(lambda: F.scaled_dot_product_attention(query, dense, dense, enable_gqa=True), repeats)
    kv_bytes = 2 * batch * context * shape.num_kv_heads * shape.head_dim * 2
    return [f"decode attention {shape.name}", f"B={batch} ctx={context}", f"{ours:.3f} +-{spread:.3f}",
            f"gather+SDPA {gather:.3f} ({gather / ours:.1f}x)", f"SDPA dense {sdpa:.3f} ({sdpa / ours:.2f}x)",
            f"{kv_bytes / ours / 1e6:.0f} GB/s"]


def bench_prefill(device: torch.device, shape: AttentionShape, prompts: int, length: int, repeats: int) -> list[str]:
    """Fresh prompts through the Triton kernel (over the paged cache) against SDPA causal per prompt, dense."""
    tensors, metadata = _attention_step(device, shape, [length] * prompts, [length] * prompts)
    scale = shape.head_dim ** -0.5
    ours, _ = median_ms(lambda: attention.paged_attention(*tensors, metadata, scale), repeats)
    query, key, value, _ = tensors
    q, k, v = (t.view(prompts, length, -1, shape.head_dim).transpose(1, 2) for t in (query, key, value))
    sdpa, _ = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), repeats)
    return [f"prefill attention {shape.name}", f"{prompts}x{length} tokens", f"{ours:.3f}", "-",
            f"SDPA dense {sdpa:.3f} ({sdpa / ours:.2f}x)", "-"]


def bench_norm(device: torch.device, shape: AttentionShape, tokens: int, repeats: int) -> list[str]:
    """RMSNorm with the residual add (the Triton kernel through the layer) against torch's add then F.rms_norm."""
    norm = RMSNorm(shape.hidden, 1e-6).to(device, torch.bfloat16)
    x, delta = (torch.randn(tokens, shape.hidden, device=device).bfloat16() for _ in range(2))
    ours, _ = median_ms(lambda: norm.add_and_norm(x, delta), repeats)
    peer, _ = median_ms(lambda: F.rms_norm(x + delta, (shape.hidden,), norm.weight, 1e-6), repeats)
    return [f"add + RMSNorm {shape.name}", f"{tokens} tokens", f"{ours:.3f}", "-",
            f"torch add+rms_norm {peer:.3f} ({peer / ours:.2f}x)", "-"]


def bench_rotary(device: torch.device, shape: AttentionShape, tokens: int, repeats: int) -> list[str]:
    """Rotary in place on q and k (the Triton kernel) against RotaryEmbedding.rotate (torch) on the same heads."""
    rotary = RotaryEmbedding(shape.head_dim, 4096, 1e6, None, device=device)
    heads = torch.randn(tokens, shape.num_heads + shape.num_kv_heads, shape.head_dim, device=device).bfloat16()
    positions = torch.randint(0, 4096, (tokens,), device=device)
    ours, _ = median_ms(lambda: rotary.rotate_(positions, heads), repeats)
    peer, _ = median_ms(lambda: rotary.rotate(positions, heads), repeats)
    return [f"rotary q+k {shape.name}", f"{tokens} tokens", f"{ours:.3f}", f"ember torch rotate {peer:.3f} ({peer / ours:.1f}x)",
            "-", "-"]


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Rows as aligned plain-text columns."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per case (median and spread reported)")
    parser.add_argument("--tests-timeout-s", type=float, default=300, help="limit for the pytest run")
    args = parser.parse_args()
    started = time.perf_counter()
    report = [f"ember gpu-check on {torch.cuda.get_device_name()} (torch {torch.__version__}, "
              f"triton {__import__('triton').__version__}, CUDA {torch.version.cuda})"]
    junit = Path(os.environ.get("TMPDIR", "/tmp")) / f"ember-gpu-check-{os.getpid()}.xml"
    test_rows, tests_passed = run_tests(junit, args.tests_timeout_s)
    report.append(format_table(["test file", "passed", "failed", "skipped", "seconds"], test_rows))
    if load_triton_kernels() is None:
        report.append("triton is not importable: no kernel benchmark")
    else:
        device, repeats = torch.device("cuda"), args.repeats
        bench_rows: list[list[str]] = []
        for shape in SHAPES:
            bench_rows += [bench_decode(device, shape, 1, 1024, repeats), bench_decode(device, shape, 64, 1024, repeats),
                           bench_prefill(device, shape, 4, 512, repeats), bench_norm(device, shape, 64, repeats),
                           bench_norm(device, shape, 4096, repeats), bench_rotary(device, shape, 64, repeats)]
        report.append(format_table(["kernel (bf16)", "shape", "triton ms", "vs torch over the same blocks", "vs torch fused peer",
                                    "KV read"], bench_rows))
    report.append(f"median of {args.repeats} timed calls each; ratios > 1 mean the Triton kernel is faster; "
                  f"total {time.perf_counter() - started:.0f} s; reproduce: scripts/gpu-check.sh")
    text = "\n\n".join(report)
    print(text)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu-check.txt").write_text(text + "\n")
    return 0 if tests_passed else 1


if __name__ == "__main__":
    sys.exit(main())
