"""The Python half of scripts/gpu-check.sh: the CUDA tests, a kernel benchmark, the engine against transformers, one table.

Run by the shell script once it has found a CUDA device (and pytest). The tests run in a pytest
subprocess (compiled Triton, not the interpreter); the kernel benchmark times each Triton kernel against
the torch code the same layer ran on CUDA before it (ember's own fallback) and against torch's
fused peer (SDPA / F.rms_norm) on the same tensors, in this one process run, median of repeats.
Shapes are Qwen2.5-1.5B's and SmolLM2-135M's attention and hidden sizes, bfloat16.

The engine section builds random-weight checkpoints of SmolLM2-135M's and Qwen2.5-1.5B's shapes (transformers'
own initialisation, saved as bfloat16 safetensors: nothing is downloaded) and, in this same process run, times
ember on the GPU (bfloat16, decode graphs) and HF transformers on the GPU (`generate`, static batches) on the same
workloads: batch-1 decode, 64 requests of 128 + 128 tokens, and `mixed` (64 requests, ember bench's mix). Then
parity: greedy tokens of the engine on the GPU in float32 against the engine on the CPU in float32, and prompt
logits of the bfloat16 engine against transformers' float32 logits on the GPU, held to twice transformers' own
bfloat16 error (tests/models/test_bfloat16_parity.py's rule).

`--device cpu --shapes tiny --skip-tests --skip-kernels --num-requests 8 --tokens 16` rehearses the engine section on
a CPU in under a minute (a tiny Llama shape; the GPU's figures are what the script is for).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
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

from ember.bench.ember_runner import EmberSettings, run_ember
from ember.bench.hf_runner import HFRunner
from ember.bench.results import RunResult
from ember.bench.workloads import BenchRequest, TokenSource, Workload, mixed
from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.device import DeviceConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.layers import attention
from ember.layers.attention import AttentionMetadata
from ember.layers.cpu_attention import PagedBatch
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.layers.triton_kernels import load_triton_kernels

ROOT = Path(__file__).resolve().parent.parent
# The test files with Triton parity tests and `cuda` tests. A new `cuda` test file goes here too: collecting the
# whole suite would import modules whose packages (fastapi, gguf, hypothesis) the GPU image lacks.
TEST_PATHS = ("tests/layers/test_triton_kernels.py", "tests/layers/test_device_dispatch.py", "tests/engine/test_device.py")
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
    # The shared assets (../shared) do not travel to a GPU machine: the tests that read them skip there.
    environment = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "EMBER_SHARED_OPTIONAL": "1"}
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


@dataclass(frozen=True)
class ModelShape:
    """A decoder's sizes, for a random-weight checkpoint of that shape."""

    name: str
    family: str  # "llama" or "qwen2"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


MODEL_SHAPES = {
    "smollm2-135m": ModelShape("smollm2-135m", "llama", 576, 30, 9, 3, 1536, 49152),
    "qwen2.5-1.5b": ModelShape("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936),
    "tiny": ModelShape("tiny", "llama", 64, 2, 4, 2, 128, 512),  # the CPU rehearsal's
}
# The targets (H200): batch-1 decode tok/s of ember; batch 64 and mixed as a multiple of HF's.
BATCH1_TARGETS = {"smollm2-135m": 400.0, "qwen2.5-1.5b": 550.0}
BATCH_RATIO_TARGET = 5.0
# Each engine's KV cache: on the GPU, room for every workload (the HF peer shares the GPU); on a CPU rehearsal, little.
KV_BYTES = {"cuda": 8 << 30, "cpu": 64 << 20}
PARITY_TOKENS = 24
PARITY_PROMPT_LENGTHS = (5, 23, 40, 64)
BF16_SLACK = 0.02


def save_random_model(shape: ModelShape, folder: Path, device: torch.device) -> Path:
    """A checkpoint of `shape` with transformers' random initialisation (made on `device`), saved in bfloat16."""
    import transformers

    config_class = transformers.LlamaConfig if shape.family == "llama" else transformers.Qwen2Config
    config = config_class(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                          num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                          num_key_value_heads=shape.kv_heads, max_position_embeddings=4096, tie_word_embeddings=True,
                          bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16).save_pretrained(folder)
    del model
    release_memory()
    return folder


def release_memory() -> None:
    """Free what dropped engines and models held (their caches' blocks), so the next one sizes itself on free memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_workloads(vocab: int, num_requests: int, tokens: int) -> dict[str, Workload]:
    """batch1 (`tokens` prompt + `tokens` output), batch64 (`num_requests` of those) and mixed (`num_requests`
    requests of ember bench's mix, prompts up to 4x and outputs up to 2x `tokens`) over random ids."""
    rng = random.Random(0)
    source = TokenSource([rng.randrange(3, vocab) for _ in range(20_000)], description="random token ids")
    batch = [BenchRequest(f"b64-{i}", source.take(rng, tokens), tokens) for i in range(num_requests)]
    return {"batch1": Workload("batch1", 0, [BenchRequest("b1", source.take(rng, tokens), tokens)]),
            "batch64": Workload("batch64", 0, batch),
            "mixed": mixed(source, seed=0, num_requests=num_requests, max_prompt=4 * tokens, max_output=2 * tokens)}


def decode_tok_s(result: RunResult) -> float:
    """A batch-1 run's decode speed: tokens after the first over the time after the first."""
    timing = result.requests[0]
    return (timing.output_tokens - 1) / (timing.finished - timing.first_token)


def bench_engine(shape: ModelShape, folder: Path, device: torch.device, num_requests: int, tokens: int) -> list[list[str]]:
    """ember and HF transformers on the same workloads, both on `device` in bfloat16, in this process run."""
    workloads = engine_workloads(shape.vocab, num_requests, tokens)
    ours: dict[str, RunResult] = {}
    for name, workload in workloads.items():
        settings = EmberSettings(label="ember", device=device.type, kv_cache_memory_bytes=KV_BYTES[device.type],
                                 max_num_seqs=1 if name == "batch1" else num_requests)
        ours[name] = run_ember(str(folder), "bfloat16", workload, settings)
        release_memory()
    peer = HFRunner(folder, "bfloat16", batch_size=num_requests, device=device.type)
    theirs = {"batch1": peer.run_batch1(workloads["batch1"]), "batch64": peer.run(workloads["batch64"]),
              "mixed": peer.run(workloads["mixed"])}
    del peer
    release_memory()
    rows = []
    ours_b1, theirs_b1 = decode_tok_s(ours["batch1"]), decode_tok_s(theirs["batch1"])
    target = BATCH1_TARGETS.get(shape.name)
    rows.append([shape.name, "batch-1 decode tok/s", f"{ours_b1:.1f}", f"{theirs_b1:.1f}", f"{ours_b1 / theirs_b1:.1f}x",
                 "-" if target is None else f">= {target:.0f} tok/s: {'met' if ours_b1 >= target else 'NOT met'}"])
    for name in ("batch64", "mixed"):
        ember_tok_s, hf_tok_s = ours[name].output_tok_s, theirs[name].output_tok_s
        ratio = ember_tok_s / hf_tok_s
        rows.append([shape.name, f"{name} output tok/s", f"{ember_tok_s:.1f}", f"{hf_tok_s:.1f}", f"{ratio:.1f}x",
                     f">= {BATCH_RATIO_TARGET:.0f}x HF: {'met' if ratio >= BATCH_RATIO_TARGET else 'NOT met'}"])
    return rows


def parity_prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in PARITY_PROMPT_LENGTHS]


def greedy_tokens(folder: Path, prompts: list[list[int]], dtype: str, device: torch.device) -> list[list[int]]:
    """The engine's greedy continuations of `prompts` (an engine built for this call, then freed)."""
    from ember.llm import LLM

    llm = LLM(str(folder), dtype=dtype, device=device.type, kv_cache_memory_bytes=KV_BYTES["cpu"])
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=PARITY_TOKENS, ignore_eos=True))
    del llm
    release_memory()
    return [output.outputs[0].token_ids for output in outputs]


def engine_prompt_logits(folder: Path, prompts: list[list[int]], dtype: str, device: torch.device) -> torch.Tensor:
    """Float32 logits [sum of prompt lengths, vocab] of every prompt position, all prompts in one step of the runner."""
    engine = LLMEngine(EngineConfig(model=str(folder), dtype=dtype, cache=CacheConfig(num_kv_blocks=64),
                                    device=DeviceConfig(device.type)))
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt, SamplingParams(max_tokens=1)))
    logits = engine.runner.all_logits(engine.scheduler.schedule()).float().cpu()
    del engine
    release_memory()
    return logits


def hf_prompt_logits(folder: Path, prompts: list[list[int]], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    with torch.inference_mode():
        logits = torch.cat([model(torch.tensor([p], device=device)).logits[0].float().cpu() for p in prompts])
    del model
    release_memory()
    return logits


def parity_rows(shape: ModelShape, folder: Path, device: torch.device) -> list[list[str]]:
    """Greedy tokens on `device` (float32) against the CPU (float32); bfloat16 logits against transformers'."""
    prompts = parity_prompts(shape.vocab)
    on_device = greedy_tokens(folder, prompts, "float32", device)
    on_cpu = greedy_tokens(folder, prompts, "float32", torch.device("cpu"))
    same = sum(a == b for a, b in zip(on_device, on_cpu, strict=True))
    firsts = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
              for a, b in zip(on_device, on_cpu, strict=True)]
    diverged = ", ".join(f"prompt {i} at token {first}" for i, first in enumerate(firsts) if first is not None) or "none"
    rows = [[shape.name, f"greedy {device.type} fp32 vs cpu fp32", f"{same}/{len(prompts)} identical",
             f"{PARITY_TOKENS} tokens each", f"diverged: {diverged}", "met" if same == len(prompts) else "NOT met"]]
    ours = engine_prompt_logits(folder, prompts, "bfloat16", device)
    exact = hf_prompt_logits(folder, prompts, torch.float32, device)
    theirs = hf_prompt_logits(folder, prompts, torch.bfloat16, device)
    our_error, their_error = (ours - exact).abs().max().item(), (theirs - exact).abs().max().item()
    agreement = (ours.argmax(-1) == exact.argmax(-1)).float().mean().item()
    within = our_error <= 2 * their_error + BF16_SLACK
    rows.append([shape.name, "bf16 logits vs HF fp32", f"max err {our_error:.4f}", f"HF bf16 {their_error:.4f}",
                 f"top-1 agreement {agreement:.3f}", f"<= 2x HF + {BF16_SLACK}: {'met' if within else 'NOT met'}"])
    return rows


def engine_section(shape_names: list[str], device: torch.device, scratch: Path, num_requests: int,
                   tokens: int) -> list[list[str]]:
    """For each shape: a random checkpoint, the timed comparison, the parity rows."""
    rows: list[list[str]] = []
    for name in shape_names:
        shape = MODEL_SHAPES[name]
        folder = save_random_model(shape, scratch / name, device)
        print(f"gpu-check: {name} saved in {folder}; timing ember and transformers", flush=True)
        rows += bench_engine(shape, folder, device, num_requests, tokens)
        rows += parity_rows(shape, folder, device)
    return rows


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Rows as aligned plain-text columns."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per kernel case (median and spread reported)")
    parser.add_argument("--tests-timeout-s", type=float, default=240, help="limit for the pytest run")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: rehearse on a CPU (with --shapes tiny)")
    parser.add_argument("--shapes", default="smollm2-135m,qwen2.5-1.5b", help=f"comma-separated: {', '.join(MODEL_SHAPES)}")
    parser.add_argument("--num-requests", type=int, default=64, help="requests of the batch64 and mixed workloads")
    parser.add_argument("--tokens", type=int, default=128, help="prompt and output tokens of batch1 and batch64")
    parser.add_argument("--skip-tests", action="store_true", help="no pytest run")
    parser.add_argument("--skip-kernels", action="store_true", help="no kernel benchmark")
    parser.add_argument("--scratch", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / f"ember-gpu-check-{os.getpid()}",
                        help="where the random checkpoints are written")
    args = parser.parse_args()
    shapes = [name for name in args.shapes.split(",") if name]
    unknown = [name for name in shapes if name not in MODEL_SHAPES]
    if unknown:
        parser.error(f"unknown shape {unknown[0]!r}; choose from {', '.join(MODEL_SHAPES)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu-check: no CUDA device here; on a CPU, rehearse with --device cpu --shapes tiny --skip-tests --skip-kernels "
                 "--num-requests 8 --tokens 16")
    started = time.perf_counter()
    where = torch.cuda.get_device_name() if device.type == "cuda" else "the CPU (a rehearsal)"
    report = [f"ember gpu-check on {where} (torch {torch.__version__}, CUDA {torch.version.cuda})"]
    tests_passed = True
    if not args.skip_tests:
        junit = Path(os.environ.get("TMPDIR", "/tmp")) / f"ember-gpu-check-{os.getpid()}.xml"
        test_rows, tests_passed = run_tests(junit, args.tests_timeout_s)
        report.append(format_table(["test file", "passed", "failed", "skipped", "seconds"], test_rows))
    if not args.skip_kernels and device.type == "cuda" and load_triton_kernels() is not None:
        report.append(kernel_table(device, args.repeats))
    engine_rows = engine_section(shapes, device, args.scratch, args.num_requests, args.tokens)
    report.append(format_table(["model shape (random weights)", "measure", "ember", "HF transformers", "ratio", "target"],
                               engine_rows))
    kernels_note = "" if args.skip_kernels else (f"kernels: median of {args.repeats} timed calls each, ratios > 1 mean "
                                                 "the Triton kernel is faster; ")
    report.append(f"{kernels_note}engine: one timed pass each, ember and transformers both on {device.type} in bfloat16, "
                  f"same process; total {time.perf_counter() - started:.0f} s; reproduce: scripts/gpu-check.sh")
    text = "\n\n".join(report)
    print(text)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu-check.txt").write_text(text + "\n")
    targets_met = all("NOT met" not in row[-1] for row in engine_rows)
    return 0 if tests_passed and targets_met else 1


def kernel_table(device: torch.device, repeats: int) -> str:
    """Every kernel case on both attention shapes, as one table."""
    bench_rows: list[list[str]] = []
    for shape in SHAPES:
        bench_rows += [bench_decode(device, shape, 1, 1024, repeats), bench_decode(device, shape, 64, 1024, repeats),
                       bench_prefill(device, shape, 4, 512, repeats), bench_norm(device, shape, 64, repeats),
                       bench_norm(device, shape, 4096, repeats), bench_rotary(device, shape, 64, repeats)]
    return format_table(["kernel (bf16)", "shape", "triton ms", "vs torch over the same blocks", "vs torch fused peer",
                         "KV read"], bench_rows)


if __name__ == "__main__":
    sys.exit(main())
