"""`ember bench parallel`: tensor, pipeline or expert parallel vs one process on the same workload, traffic counted.

Both engines run the same prompts (greedy, fixed lengths) in one process run; the result is
the parallel / single throughput ratio (median of repeats), the bytes each rank sent per token
as counted by the communicator next to the mode's formula (ember.parallel.volume), the share
of rank 0's step time spent inside collectives (waiting for the slower rank included), for
pipelines the share rank 0 sits idle waiting for the later stages, the weight and KV bytes each
rank holds, and for TP a model of the scaling on hardware where compute and links are fast
(the measured scaling on a small shared CPU box says little about that).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ember.bench.parallel_modes import padding
from ember.engine.sampling_params import SamplingParams
from ember.layers.expert_parallel import ExpertParallelMoE
from ember.llm import LLM
from ember.models.loader import compute_dtype
from ember.parallel.config import ParallelConfig
from ember.parallel.volume import parallel_volume
from ember.parallel.worker import parameter_bytes


@dataclass(frozen=True)
class HardwareModel:
    """Where the modelled scaling is computed: decode reads every weight once per step (memory bound)."""

    name: str = "8x H100 SXM (NVLink)"
    memory_bandwidth_gbs: float = 3350.0
    link_bandwidth_gbs: float = 450.0  # per direction, per GPU
    collective_latency_us: float = 8.0  # one all-reduce's fixed cost


def modelled_speedup(
    weight_bytes: int, all_reduce_bytes_per_token: float, all_reduces: int, batch_tokens: int, world_size: int, hardware: HardwareModel
) -> float:
    """Decode-step speedup of TP=world_size over one device: weight reads shrink 1/T, all-reduces are added."""
    one = weight_bytes / (hardware.memory_bandwidth_gbs * 1e9)
    compute = one / world_size
    communicate = all_reduces * hardware.collective_latency_us * 1e-6 + (
        all_reduce_bytes_per_token * batch_tokens / (hardware.link_bandwidth_gbs * 1e9)
    )
    return one / (compute + communicate)


def _prompts(vocab_size: int, count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=generator).tolist() for _ in range(count)]


def _timed_runs(llm: LLM, prompts: list[list[int]], params: SamplingParams, repeats: int) -> tuple[list[float], list[int]]:
    """Seconds of each repeat and the tokens of each forward pass (engine step) of the last one."""
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm up
    seconds = []
    for _ in range(repeats):
        records = llm.engine.step_records()
        first_step = records[-1].step_index + 1 if records else 0
        if llm.engine.workers is not None:
            llm.engine.workers.communicator.stats.reset()
        started = time.perf_counter()
        llm.generate(prompts, params)
        seconds.append(time.perf_counter() - started)
        after = llm.engine.step_records()
        if after and after[0].step_index > first_step:
            raise RuntimeError("the engine kept fewer step records than one repeat ran: use fewer prompts or tokens per repeat")
        pass_tokens = [r.num_scheduled_tokens for r in after if r.step_index >= first_step]
    return seconds, pass_tokens


def run_parallel_bench(
    model: str, parallel: ParallelConfig, num_prompts: int, prompt_len: int, max_tokens: int, repeats: int, seed: int,
    dtype: str = "float32",
) -> dict:
    """One process and `parallel` on the same workload, both loaded at `dtype` ("auto": a quantized checkpoint's ranks
    hold its blocks, sliced; "float32": every rank a float copy of its slice)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    options = dict(dtype=dtype, enable_prefix_caching=False, max_num_seqs=num_prompts)
    single = LLM(model, **options)
    prompts = _prompts(single.engine.model_config.vocab_size, num_prompts, prompt_len, seed)
    single_s, _ = _timed_runs(single, prompts, params, repeats)
    single_threads = torch.get_num_threads()
    whole_bytes = parameter_bytes(single.engine.runner.model)
    del single
    parallel_llm = LLM(model, **options, **_parallel_options(parallel))
    try:
        parallel_s, parallel_passes = _timed_runs(parallel_llm, prompts, params, repeats)
        workers = parallel_llm.engine.workers
        stats = workers.communicator.stats  # of the last repeat
        config = parallel_llm.engine.model_config
        element_bytes = torch.empty((), dtype=compute_dtype(parallel_llm.engine.config.dtype)).element_size()
        volume = parallel_volume(config, parallel, element_bytes)
        counted_tokens = volume.counted_tokens(parallel_passes, parallel.world_size)
        hardware = HardwareModel()
        modelled = None
        if parallel.mode == "tensor":
            read_bytes = whole_bytes // 2 if dtype == "float32" else whole_bytes  # float32 weights read as bf16 there
            modelled = modelled_speedup(
                read_bytes, volume.bytes_per_token / element_bytes * 2, volume.calls_per_forward, 1, parallel.world_size, hardware
            )
        return {
            "model": model,
            "dtype": dtype,
            "mode": parallel.mode,
            "world_size": parallel.world_size,
            "workload": {"prompts": num_prompts, "prompt_len": prompt_len, "max_tokens": max_tokens, "repeats": repeats},
            "single_s": single_s,
            "single_threads": single_threads,
            "parallel_s": parallel_s,
            "tokens_per_run": sum(parallel_passes),
            "counted_tokens_per_run": counted_tokens,  # what the formula is per (padded for a sequence split)
            "speedup": statistics.median(single_s) / statistics.median(parallel_s),
            "single_output_tok_s": num_prompts * max_tokens / statistics.median(single_s),
            "parallel_output_tok_s": num_prompts * max_tokens / statistics.median(parallel_s),
            "collective": " + ".join(volume.kinds),
            "bytes_per_token_counted": sum(stats.bytes_sent[kind] for kind in volume.kinds) / counted_tokens,
            "bytes_per_token_formula": volume.bytes_per_token,
            "formula": volume.formula,
            "calls_per_forward": volume.calls_per_forward,
            # Rank 0 receives the gather (sends nothing); each worker's share is the formula's.
            "logits_gather_bytes_per_sampled_token": volume.logits_gather_bytes_per_sampled_token,
            "broadcast_bytes_counted": stats.bytes_sent["broadcast"],
            "collective_seconds": dict(stats.seconds),
            "communication_share": stats.total_seconds / parallel_s[-1],
            # Rank 0 waiting for the later stages' results: the pipeline bubble as rank 0 sees it (no micro-batches).
            "rank0_idle_share": stats.seconds["receive"] / parallel_s[-1],
            "whole_weight_bytes": whole_bytes,
            "rank_weight_bytes": workers.memory.parameter_bytes,
            "threads_per_rank": workers.threads_per_rank,
            "rank_kv_cache_bytes": workers.memory.kv_cache_bytes,
            "hardware_model": asdict(hardware),
            "modelled_speedup_batch1": modelled,
            "expert_pairs_per_rank": _expert_load(parallel_llm.engine.runner.model),
        }
    finally:
        parallel_llm.shutdown()


def _expert_load(model: torch.nn.Module) -> list[int] | None:
    """Routed (token, expert) pairs each rank ran since load, over every MoE block (None: not expert parallel)."""
    blocks = [module for module in model.modules() if isinstance(module, ExpertParallelMoE)]
    if not blocks:
        return None
    return [sum(loads) for loads in zip(*(block.pairs_per_rank for block in blocks), strict=True)]


def _parallel_options(parallel: ParallelConfig) -> dict:
    return {
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "enable_expert_parallel": parallel.enable_expert_parallel,
        "enable_sequence_parallel": parallel.enable_sequence_parallel,
        "exact_row_parallel": parallel.exact_row_parallel,
    }


def _token_unit(result: dict) -> str:
    return "token" if padding(result) is None else "padded token"


def _padding_rows(result: dict) -> list[str]:
    """Where the formula counts padded tokens: how many the split padded, so the padding's cost stays visible."""
    if (padded := padding(result)) is None:
        return []
    tokens, counted = padded
    return [f"| tokens per run, computed / padded to a multiple of {result['world_size']} for the split | "
            f"{tokens} / {counted} ({counted / tokens:.2f}x) |"]


def markdown(result: dict) -> str:
    """The result as a short Markdown report."""
    mib = 2**20
    ranks = ", ".join(f"{b / mib:.2f}" for b in result["rank_weight_bytes"])
    kv = ", ".join(f"{b / mib:.2f}" for b in result["rank_kv_cache_bytes"])
    mode, size = result["mode"], result["world_size"]
    lines = [
        f"## {mode} parallel, {size} ranks, vs one process ({result['model']}, --dtype {result.get('dtype', 'float32')})",
        "",
        "| measure | value |",
        "|---|---|",
        f"| run time, 1 process (median s) | {statistics.median(result['single_s']):.2f} |",
        f"| run time, {mode} x{size} (median s) | {statistics.median(result['parallel_s']):.2f} |",
        *([f"| torch threads per rank (one process: {result['single_threads']}) | {result['threads_per_rank']} |"]
          if "threads_per_rank" in result else []),
        *([f"| output tok/s, 1 process / {mode} x{size} | {result['single_output_tok_s']:.1f} / {result['parallel_output_tok_s']:.1f} |"]
          if "single_output_tok_s" in result else []),
        f"| measured speedup (1 process / parallel) | {result['speedup']:.2f}x |",
        f"| {result['collective']} bytes per {_token_unit(result)} per rank, counted | {result['bytes_per_token_counted']:.1f} |",
        f"| same, formula {result['formula']} | {result['bytes_per_token_formula']:.1f} |",
        *_padding_rows(result),
        f"| {result['collective']} calls per forward pass | {result['calls_per_forward']} |",
        f"| logits gather bytes per sampled token, per worker (ceil(V/W) e) | {result['logits_gather_bytes_per_sampled_token']} |",
        f"| plan broadcast bytes (last run, control) | {result['broadcast_bytes_counted']:.0f} |",
        f"| time in collectives, share of rank 0's run | {result['communication_share']:.0%} |",
        f"| weights, whole model (MiB) | {result['whole_weight_bytes'] / mib:.2f} |",
        f"| weights per rank (MiB) | {ranks} |",
        f"| KV cache per rank (MiB) | {kv} |",
    ]
    if mode == "pipeline":
        lines.append(f"| rank 0 idle waiting for later stages (bubble, no micro-batches) | {result['rank0_idle_share']:.0%} |")
    if result["expert_pairs_per_rank"] is not None:
        pairs = result["expert_pairs_per_rank"]
        shares = ", ".join(f"{p / sum(pairs):.0%}" for p in pairs)
        lines.append(f"| routed (token, expert) pairs per rank since load | {', '.join(map(str, pairs))} ({shares}) |")
    if result["modelled_speedup_batch1"] is not None:
        lines.append(
            f"| modelled batch-1 decode speedup on {result['hardware_model']['name']} "
            f"({'bf16' if result.get('dtype', 'float32') == 'float32' else 'weights as loaded'}) | {result['modelled_speedup_batch1']:.2f}x |"
        )
    return "\n".join(lines)
