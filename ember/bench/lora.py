"""`ember bench lora`: output tok/s of `mixed` with 0, 1, 4 and 16 distinct LoRA adapters, against the base model.

Every variant runs the same requests (the `mixed` workload, greedy, ignore_eos) on a fresh engine, interleaved
per repeat: the base model on its own weights (no adapter layers at all), then an adapter-serving engine
(`max_loras` 16) whose requests take adapters round robin, random adapters of rank 8 and 64 over every
attention and MLP linear (written as PEFT writes them, so the engine reads them through its PEFT reader).
`0 adapters` is the adapter-serving engine with every request on the base model (the wrappers' cost alone).
The load time is one adapter read from disk for the model (`load_lora_adapter`), median of the repeats.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median

import torch
from safetensors.torch import save_file

from ember.bench.stats import ratio, spread
from ember.bench.suite import BenchOptions, _interleave, model_path, token_source
from ember.bench.workloads import Workload, mixed
from ember.engine.config import EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.lora import adapter_dtype
from ember.engine.lora_request import LoRAConfig, LoRARequest
from ember.engine.sampling_params import SamplingParams
from ember.models.causal_lm import CausalLM
from ember.models.loader import load_model
from ember.models.lora_adapter import adaptable_modules, load_lora_adapter

ADAPTER_COUNTS = (0, 1, 4, 16)
RANKS = (8, 64)
MAX_LORAS = 16


def save_random_adapter(model: CausalLM, folder: Path, rank: int, seed: int) -> Path:
    """A random PEFT LoRA adapter of `model` over every adaptable linear, as adapter_config.json + safetensors."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, target in adaptable_modules(model).items():
        size = target.part_sizes[target.part]
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(rank, target.in_features, generator=generator) * 0.02
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(size, rank, generator=generator) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    modules = sorted({name.rsplit(".", 1)[-1] for name in adaptable_modules(model)})
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                            "target_modules": modules}))
    return folder


def variants(ranks: tuple[int, ...] = RANKS) -> dict[str, tuple[int, int]]:
    """The runs of one repeat, in order, as (distinct adapters, rank): the base model (0, 0) on its own weights, then
    each adapter count at each rank on the adapter-serving engine (0 adapters once: the wrappers' cost alone)."""
    counts = [(count, rank) for rank in ranks for count in ADAPTER_COUNTS if count or rank == ranks[0]]
    return {"base model": (0, 0), **{f"{count} adapters, rank {rank}": (count, rank) for count, rank in counts}}


def bench_lora(options: BenchOptions, folder: Path, num_requests: int, max_prompt: int, max_output: int,
               dtype: str | None = None, ranks: tuple[int, ...] = RANKS) -> dict:
    """The section: each variant's output tok/s (median, min-max) and its ratio to the base model, and load times.
    `dtype` None: the first of `options.dtypes`."""
    path = model_path(options.model)
    dtype = dtype or options.dtypes[0]
    workload = mixed(token_source(options.model), options.seed, num_requests, max_prompt, max_output)
    base_weights, adapter_weights = load_model(path, dtype), load_model(path, dtype)  # the second gets adapter layers
    adapters = {rank: [LoRARequest(f"r{rank}-{i}", rank * 100 + i + 1,
                                   str(save_random_adapter(adapter_weights.model, folder / f"r{rank}-{i}", rank, i)))
                       for i in range(max(ADAPTER_COUNTS))] for rank in ranks}
    lora = LoRAConfig(max_loras=MAX_LORAS, max_lora_rank=max(ranks))
    runners = {"base model": lambda: _run(EngineConfig(model=str(path), dtype=dtype), base_weights, workload, [])}
    for name, (count, rank) in list(variants(ranks).items())[1:]:
        runners[name] = lambda count=count, rank=rank: _run(EngineConfig(model=str(path), dtype=dtype, lora=lora),
                                                            adapter_weights, workload, adapters[rank][:count])
    runs = _interleave(options, "lora", runners)
    base = median(runs["base model"])
    by_variant = {name: {"output_tok_s": spread(values).to_dict(), "over_base": ratio(median(values), base)}
                  for name, values in runs.items()}
    held_in = adapter_dtype(adapter_weights.model, lora.lora_dtype)
    load_s = {rank: spread([_load_time(adapter_weights.model, adapters[rank][0], held_in)
                            for _ in range(options.repeats)]).to_dict() for rank in ranks}
    return {"dtype": dtype, "adapter_dtype": str(held_in).removeprefix("torch."), "workload": workload.params,
            "repeats": options.repeats, "variants": by_variant, "load_s": load_s}


def _run(config: EngineConfig, weights, workload: Workload, adapters: list[LoRARequest]) -> float:
    """Output tok/s of one pass of `workload`, request i on adapter i mod len(adapters) (the base model with none)."""
    engine = LLMEngine(config, loaded=weights)
    for i, request in enumerate(workload.requests):
        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True)
        adapter = adapters[i % len(adapters)] if adapters else None
        engine.add_request(EngineRequest(request.request_id, request.prompt_token_ids, params, lora_request=adapter))
    started, output_tokens = time.monotonic(), 0
    while engine.has_unfinished_requests():
        output_tokens += sum(len(c.token_ids) for output in engine.step() for c in output.outputs)
    return output_tokens / (time.monotonic() - started)


def _load_time(model: CausalLM, adapter: LoRARequest, dtype: torch.dtype) -> float:
    started = time.monotonic()
    load_lora_adapter(adapter.lora_path, model, max(RANKS), dtype)  # the rank bound only refuses, it costs nothing
    return time.monotonic() - started


def format_lora_section(section: dict) -> str:
    """The section as markdown (the report's and the subcommand's)."""
    lines = ["| variant | output tok/s | over the base model |", "|---|---|---|"]
    for name, entry in section["variants"].items():
        rate = entry["output_tok_s"]
        lines.append(f"| {name} | {rate['median']:.1f} ({rate['min']:.1f}-{rate['max']:.1f}) | {entry['over_base']:.2f}x |")
    loads = ", ".join(f"rank {rank}: {entry['median'] * 1000:.0f} ms" for rank, entry in section["load_s"].items())
    return "\n".join([*lines, "", f"adapter load time (read from disk for the model, median): {loads}"])
