"""`ember kv`: the KV planner. Bytes per token and sequence, sequences that fit, formula beside reality."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ember.config.model import ModelConfig
from ember.engine.config import parse_bytes
from ember.models.kv_planner import (
    ELEMENT_SIZES,
    KNOWN_SHAPES,
    KVPlan,
    compare_variants,
    format_bytes,
    format_table,
    plan,
)

if TYPE_CHECKING:  # torch loads when a checkpoint is measured, not to build the parser
    import torch

# --dtype values the engine can allocate its cache in, by the name of the runner's torch dtype; the rest are formula only.
ENGINE_CACHE_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "fp8": "float8_e4m3fn"}
UNALLOCATED_DTYPES = tuple(d for d in ELEMENT_SIZES if d not in ENGINE_CACHE_DTYPES)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kv",
        help="plan the KV cache: bytes per token and per sequence, sequences that fit a budget",
        description=(
            "MODEL is a known shape (" + ", ".join(KNOWN_SHAPES) + "), an HF config.json, "
            "or a checkpoint (registered name, HF folder, GGUF); a checkpoint is loaded and its "
            "cache allocated, so the engine's real bytes sit beside the formula."
        ),
    )
    parser.add_argument("model", nargs="?", default=None, help="known shape, config.json or checkpoint")
    parser.add_argument("--dtype", default="float16", choices=sorted(ELEMENT_SIZES))
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--memory", type=parse_bytes, default=None, help="KV budget, e.g. 24GB or 512MiB")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--compare", action="store_true", help="MHA, GQA-8, MQA and MLA variants of MODEL's size")
    parser.add_argument("--plot", default="kv-compare.png", help="bar chart PNG written by --compare")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = args.model or ("llama-2-7b" if args.compare else None)
    if name is None:
        raise ValueError("give a model: a known shape (" + ", ".join(KNOWN_SHAPES) + "), a config.json or a checkpoint")
    config, allocated = _read_model(name, args.dtype, args.block_size, args.context, measure=not args.compare)
    if allocated is None and args.dtype in UNALLOCATED_DTYPES and not args.compare:
        print(f"(--dtype {args.dtype}: formula only, the engine has no {args.dtype} KV cache; --kv-cache-dtype takes fp8)")
    if args.compare:
        plans = [
            plan(f"{_display_name(name)} {label}", variant, args.dtype, args.context, args.memory, args.block_size)
            for label, variant in compare_variants(config)
        ]
        print(format_table(plans))
        _plot(plans, Path(args.plot))
        print(f"bar chart: {args.plot}")
        return 0
    result = plan(_display_name(name), config, args.dtype, args.context, args.memory, args.block_size, allocated)
    print(format_table([result]))
    print(_summary(result))
    if args.memory is not None:
        print(_fits_by_dtype(_display_name(name), config, args))
    return 0


def _display_name(name: str) -> str:
    """A known shape or registered name as given; a path by its last part (config.json by its folder)."""
    path = Path(name)
    if len(path.parts) <= 1:
        return name
    return path.parent.name if path.name == "config.json" else path.name


def _read_model(
    name: str, dtype: str, block_size: int, context: int, measure: bool
) -> tuple[ModelConfig, int | None]:
    """The model's config, and the KV bytes per token its engine allocates when it is a checkpoint."""
    from ember.models.family_registry import config_from_hf

    if name in KNOWN_SHAPES:
        return config_from_hf(KNOWN_SHAPES[name]), None
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".json":
        with open(path, encoding="utf-8") as f:
            return config_from_hf(json.load(f)), None
    import torch

    from ember.models.loader import load_model
    from ember.models.registry import resolve_model

    loaded = load_model(resolve_model(name), "auto")  # the cache dtype is the runner's, whatever the weights'
    if not measure or dtype not in ENGINE_CACHE_DTYPES:
        return loaded.config, None
    cache_dtype = getattr(torch, ENGINE_CACHE_DTYPES[dtype])
    return loaded.config, _allocated_bytes_per_token(loaded.model, block_size, context, cache_dtype)


def _allocated_bytes_per_token(model: torch.nn.Module, block_size: int, context: int, cache_dtype: torch.dtype) -> int:
    """Build the engine's runner with one sequence's blocks in `cache_dtype` and read back what it allocated."""
    import torch

    from ember.engine.runner import ModelRunner
    from ember.kv.cache_manager import KVCacheManager
    from ember.layers.sampler import Sampler

    num_blocks = min(-(-context // block_size), 64)
    kv = KVCacheManager(num_blocks, block_size)
    runner = ModelRunner(model, num_blocks, block_size, kv, Sampler(torch.Generator()), frozenset(), cache_dtype=cache_dtype)
    return runner.kv_cache_bytes // (num_blocks * block_size)


def _fits_by_dtype(name: str, config: ModelConfig, args: argparse.Namespace) -> str:
    """Sequences of --context tokens that --memory holds with each engine cache dtype: what a narrower cache buys."""
    counts = [
        f"{dtype} {plan(name, config, dtype, args.context, args.memory, args.block_size).num_sequences}"
        for dtype in ("float32", "bfloat16", "fp8")
    ]
    return f"sequences that fit by KV cache dtype (--kv-cache-dtype): {', '.join(counts)}"


def _summary(result: KVPlan) -> str:
    lines = [
        f"formula: {result.bytes_per_token} bytes/token ({format_bytes(result.bytes_per_token)}), "
        f"{format_bytes(result.bytes_per_sequence)} per {result.context_tokens}-token sequence",
        f"the same model with MHA: {result.mha_bytes_per_token} bytes/token, {result.ratio_to_mha:.3g}x this model's",
    ]
    if result.allocated_bytes_per_token is not None:
        allocated = result.allocated_bytes_per_token
        if allocated == result.bytes_per_token:
            lines.append(f"engine allocated: {allocated} bytes/token (matches the formula)")
        else:
            lines.append(
                f"engine allocated: {allocated} bytes per token slot (layer groups share block ids, so windowed "
                "and global layers do not each pay for every slot)"
            )
    if result.num_sequences is not None and result.memory_bytes is not None:
        lines.append(f"{result.num_sequences} sequences of {result.context_tokens} tokens fit in {format_bytes(result.memory_bytes)}")
    return "\n".join(lines)


def _plot(plans: list[KVPlan], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [p.attention for p in plans]
    values = [p.bytes_per_sequence / 1e9 for p in plans]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    bars = axes.bar(labels, values, color=["#b33", "#d83", "#3a7", "#37b"][: len(plans)])
    for bar, p in zip(bars, plans, strict=True):
        axes.annotate(format_bytes(p.bytes_per_sequence), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    axes.set_ylabel(f"KV GB per {plans[0].context_tokens}-token sequence ({plans[0].dtype})")
    axes.set_title(plans[0].name.rsplit(" ", 1)[0])
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
