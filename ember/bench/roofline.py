"""This machine's ceilings: memory read bandwidth (a STREAM-like C probe) and matmul throughput.

Bandwidth is measured by a small C program compiled at run time (gcc -O3 -march=native
-fopenmp) that sums a 1 GiB array of doubles with all threads, best of several passes; torch's
own reductions understate it on some CPUs. Without a compiler, numpy's sum is the fallback and
the result says so. Decode of one token reads every weight once (an untied embedding table
only a row) plus the KV cache so far, so `bandwidth / bytes_per_token` bounds single-stream tokens/s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROBE_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t bytes = argc > 1 ? strtoull(argv[1], 0, 10) : (1ull << 30);
    int passes = argc > 2 ? atoi(argv[2]) : 10;
    size_t n = bytes / sizeof(double);
    double *a = aligned_alloc(64, n * sizeof(double));
    if (!a) { fprintf(stderr, "cannot allocate %zu bytes\n", bytes); return 1; }
    /* first touch from the threads that will read it, so pages land near them */
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (double)(i & 1023);
    /* Each thread reads its share as STREAMS interleaved streams with independent sums: one
       stream with one running sum is bound by the add latency, not by memory, on some CPUs. */
    const int streams = 8;
    double best = 1e30, checksum = 0.0;
    size_t read_bytes = 0;
    for (int p = 0; p < passes; p++) {
        double s = 0.0;
        size_t counted = 0;
        double t0 = omp_get_wtime();
        #pragma omp parallel reduction(+:s, counted)
        {
            size_t share = n / omp_get_num_threads(), segment = share / streams / 4 * 4;
            const double *base = a + share * omp_get_thread_num();
            double sums[8][4] = {{0}};
            for (size_t i = 0; i < segment; i += 4)
                for (int j = 0; j < streams; j++)
                    for (int v = 0; v < 4; v++) sums[j][v] += base[j * segment + i + v];
            for (int j = 0; j < streams; j++)
                for (int v = 0; v < 4; v++) s += sums[j][v];
            counted = segment * streams * sizeof(double);
        }
        double dt = omp_get_wtime() - t0;
        if (dt < best) best = dt;
        checksum += s;
        read_bytes = counted;
    }
    printf("%.6f %d %.1f\n", (double)read_bytes / best / 1e9, omp_get_max_threads(), checksum);
    free(a);
    return 0;
}
"""


@dataclass
class Bandwidth:
    """Best-of-passes read bandwidth and how it was measured."""

    gb_per_s: float
    method: str
    threads: int
    array_bytes: int


def measure_bandwidth(array_bytes: int = 1 << 30, passes: int = 10, compiler: str | None = None) -> Bandwidth:
    """Read bandwidth in GB/s (10^9 bytes/s) with all threads: C probe, else numpy."""
    cc = compiler or shutil.which("gcc") or shutil.which("cc")
    if cc is not None:
        try:
            return _c_probe(cc, array_bytes, passes)
        except (subprocess.CalledProcessError, OSError, ValueError):
            pass  # no OpenMP or no -march=native here: fall back below, and say so
    return _numpy_probe(array_bytes, passes)


def _c_probe(cc: str, array_bytes: int, passes: int) -> Bandwidth:
    with tempfile.TemporaryDirectory(prefix="ember-roofline-") as scratch:
        source = Path(scratch) / "probe.c"
        binary = Path(scratch) / "probe"
        source.write_text(PROBE_SOURCE)
        subprocess.run([cc, "-O3", "-march=native", "-fopenmp", str(source), "-o", str(binary)], check=True, capture_output=True)
        completed = subprocess.run([str(binary), str(array_bytes), str(passes)], check=True, capture_output=True, text=True)
    gb_per_s, threads, _ = completed.stdout.split()
    return Bandwidth(float(gb_per_s), f"C probe ({Path(cc).name} -O3 -march=native -fopenmp, sum of doubles, 8 streams per thread)", int(threads), array_bytes)


def _numpy_probe(array_bytes: int, passes: int) -> Bandwidth:
    import numpy as np

    array = np.ones(array_bytes // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        array.sum()
        best = min(best, time.perf_counter() - started)
    return Bandwidth(array.nbytes / best / 1e9, "numpy sum (no C compiler found; understates)", 1, array.nbytes)


def measure_matmul(dtype: str = "float32", size: int = 1024, seconds: float = 1.0) -> float:
    """Square matmul throughput in GFLOP/s with torch's threads."""
    import torch

    torch_dtype = getattr(torch, dtype)
    a = torch.randn(size, size).to(torch_dtype)
    b = torch.randn(size, size).to(torch_dtype)
    torch.mm(a, b)
    count = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        torch.mm(a, b)
        count += 1
    elapsed = time.perf_counter() - started
    return 2.0 * size**3 * count / elapsed / 1e9


@dataclass
class Roofline:
    bandwidth: Bandwidth
    matmul_gflops: dict[str, float]

    def to_dict(self) -> dict:
        return {"bandwidth": asdict(self.bandwidth), "matmul_gflops": self.matmul_gflops}


def measure_roofline(dtypes: tuple[str, ...] = ("float32", "bfloat16"), array_bytes: int = 1 << 30) -> Roofline:
    return Roofline(measure_bandwidth(array_bytes), {dtype: measure_matmul(dtype) for dtype in dtypes})


# -- bytes read per decode step ---------------------------------------------------------------

BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}  # auto: float32 activations and KV cache
# The token-embedding table's name in each checkpoint format (GGUF, transformers' families).
EMBEDDING_SUFFIXES = ("token_embd.weight", "embed_tokens.weight", "wte.weight", "word_embeddings.weight")


@dataclass(frozen=True)
class DecodeBytes:
    """Bytes one decode step of one sequence reads: the weights, and its KV cache at `context_len`.

    An untied embedding table is not counted: a step reads only its sequence's row (the LM head,
    a separate tensor, is read whole). A tied table is read whole once, as the LM head.
    """

    weight_bytes: int
    kv_bytes: int
    context_len: int
    kv_bytes_per_token: int
    tied_embeddings: bool

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes

    def to_dict(self) -> dict:
        return dict(asdict(self), total=self.total)


def model_config(model_path: Path):
    """The checkpoint's ModelConfig, read without loading its weights."""
    from ember.models.gguf_loader import is_gguf_file, read_gguf_config
    from ember.models.hf_loader import is_hf_folder, read_hf_config

    if is_hf_folder(model_path):
        return read_hf_config(model_path)
    if is_gguf_file(model_path):
        from ember.gguf_file import GGUFFile

        return read_gguf_config(GGUFFile.open(model_path))
    raise ValueError(f"{model_path}: the roofline reads GGUF files and HF safetensors folders")


def tensor_elements(model_path: Path) -> dict[str, int]:
    """Element count of every tensor of the checkpoint, by name."""
    if model_path.is_file():
        from ember.gguf_file import GGUFFile

        return {t.name: t.n_elements for t in GGUFFile.open(model_path).tensors}
    from safetensors import safe_open

    counts = {}
    for file in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                counts[name] = _prod(f.get_slice(name).get_shape())
    return counts


def weight_elements(model_path: Path, tied_embeddings: bool, hidden_size: int) -> int:
    """Weight elements a decode step reads: every tensor once, an untied embedding table as one row."""
    total = 0
    for name, count in tensor_elements(model_path).items():
        is_embedding = name.endswith(EMBEDDING_SUFFIXES)
        total += hidden_size if is_embedding and not tied_embeddings else count
    return total


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def kv_bytes_per_token(config, dtype: str) -> int:
    """KV cache bytes per cached token over every layer, by ember's own per-layer specs."""
    from ember.kv.specs import KVCacheLayout, kv_specs_for

    return KVCacheLayout.from_specs(kv_specs_for(config)).bytes_per_token(BYTES_PER_ELEMENT[dtype])


def stored_weight_bytes(model_path: Path, tied_embeddings: bool, hidden_size: int) -> int:
    """Weight bytes a decode step reads as the checkpoint stores them (a quantized GGUF's blocks): dtype auto."""
    if not model_path.is_file():
        return weight_elements(model_path, tied_embeddings, hidden_size) * BYTES_PER_ELEMENT["float32"]
    from ember.gguf_file import GGUFFile

    total = 0
    for tensor in GGUFFile.open(model_path).tensors:
        is_embedding = tensor.name.endswith(EMBEDDING_SUFFIXES)
        rows = tensor.n_elements // hidden_size
        total += tensor.n_bytes // rows if is_embedding and not tied_embeddings else tensor.n_bytes
    return total


def decode_bytes(model_path: Path, dtype: str, context_len: int = 0) -> DecodeBytes:
    """What one decode step of one sequence at `context_len` cached tokens reads at `dtype`."""
    from ember.kv.specs import KVCacheLayout, kv_specs_for

    config = model_config(model_path)
    element_size = BYTES_PER_ELEMENT[dtype]
    if dtype == "auto":
        weights = stored_weight_bytes(model_path, config.tie_word_embeddings, config.hidden_size)
    else:
        weights = weight_elements(model_path, config.tie_word_embeddings, config.hidden_size) * element_size
    kv = KVCacheLayout.from_specs(kv_specs_for(config)).bytes_per_sequence(context_len, element_size)
    return DecodeBytes(weights, kv, context_len, kv_bytes_per_token(config, dtype), config.tie_word_embeddings)


def bytes_per_token(model_path: Path, dtype: str, context_len: int = 0) -> int:
    """Bytes one decode step of one sequence reads at `dtype`: weights plus its KV cache at `context_len`."""
    return decode_bytes(model_path, dtype, context_len).total


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
