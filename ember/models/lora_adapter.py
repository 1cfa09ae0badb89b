"""Read a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, or .bin read tensors-only) for a model.

PEFT names each adapted module as transformers names it (`model.layers.0.self_attn.q_proj`); ember fuses some of
them (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`, declared by `FusedProjections`). Each ember linear gets
one `LoRAProduct`: the parts' A matrices stacked, their B matrices block-diagonal, the scaling (alpha / r, or
alpha / sqrt(r) with rsLoRA) folded into B. What ember cannot serve is refused here, at load, by name: DoRA, an
embedding or LM-head adapter, `modules_to_save`, trained biases, per-module rank or alpha patterns, a target the
family has no linear for, a rank above the engine's `max_lora_rank`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.lora import LoRALinear, LoRAProduct
from ember.models.causal_lm import CausalLM
from ember.models.packing import FusedProjections
from ember.quant.ggml.layers import GGMLLinear, GGMLRowPartsLinear
from ember.quant.int8.w8a8_layers import W8A8Linear

PEFT_PREFIX = "base_model.model."
ADAPTABLE_LINEARS = (nn.Linear, GGMLLinear, GGMLRowPartsLinear, W8A8Linear)


class LoRAAdapterError(ValueError):
    """An adapter ember cannot serve on this model; the message names what and what to do."""


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter read for one model: its rank and each adapted ember linear's product, by module name."""

    path: Path
    rank: int
    products: dict[str, LoRAProduct]


@dataclass(frozen=True)
class AdaptedModule:
    """Where a transformers module name lands in ember: the ember linear, its part index and the parts' row sizes."""

    module_name: str
    part: int
    part_sizes: tuple[int, ...]
    in_features: int


def adaptable_modules(model: CausalLM) -> dict[str, AdaptedModule]:
    """transformers module name -> where its adapter goes, for every linear of the decoder layers (fused ones by part)."""
    modules = dict(model.named_modules())
    found: dict[str, AdaptedModule] = {}
    for name, module in modules.items():  # parents come before their children: a linear's insides are not linears of their own
        if not name.startswith("model.layers.") or not isinstance(module, ADAPTABLE_LINEARS + (LoRALinear,)):
            continue
        if any(outer in found for outer in _parents(name)):
            continue
        linear = _linear_of(module)
        found[name] = AdaptedModule(name, 0, (linear.out_features,), linear.in_features)
    for name, module in modules.items():
        if not name.startswith("model.layers.") or not isinstance(module, FusedProjections):
            continue
        for fused, parts in module.packed_modules.items():
            fused_name = f"{name}.{fused}"
            if fused_name not in found:
                continue
            fused_module = found.pop(fused_name)
            sizes = _part_sizes(model.config, parts, fused_module.part_sizes[0])
            if sizes is None:
                continue  # parts whose sizes the config does not give: refused if an adapter names them
            for index, part in enumerate(parts):
                found[f"{name}.{part}"] = AdaptedModule(fused_name, index, sizes, fused_module.in_features)
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def _linear_of(module: nn.Module) -> nn.Module:
    return module.base if isinstance(module, LoRALinear) else module


def _part_sizes(config: ModelConfig, parts: tuple[str, ...], total: int) -> tuple[int, ...] | None:
    """Each fused part's output rows, from the config (q / k / v heads, gate / up width); None unless they add up."""
    known = {
        "q_proj": config.num_heads * config.head_dim,
        "k_proj": config.num_kv_heads * config.head_dim,
        "v_proj": config.num_kv_heads * config.head_dim,
        "gate_proj": config.intermediate_size,
        "up_proj": config.intermediate_size,
    }
    if any(part not in known for part in parts):
        return None
    sizes = tuple(known[part] for part in parts)
    return sizes if sum(sizes) == total else None


def read_adapter_config(folder: Path) -> dict:
    """adapter_config.json, checked for what ember serves (LoRAAdapterError naming the field otherwise)."""
    config_path = folder / "adapter_config.json"
    if not config_path.is_file():
        raise LoRAAdapterError(f"{folder} has no adapter_config.json: give the folder PEFT's save_pretrained wrote")
    config = json.loads(config_path.read_text())
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise LoRAAdapterError(f"adapter {folder} is a {peft_type} adapter; ember serves LoRA adapters only")
    if config.get("use_dora"):
        raise LoRAAdapterError(f"adapter {folder} uses DoRA (use_dora: true), which ember does not serve; "
                               "merge it into the weights (peft's merge_and_unload) and serve the merged model")
    refusals = {
        "modules_to_save": "modules_to_save (fully trained copies of modules)",
        "rank_pattern": "rank_pattern (per-module ranks)",
        "alpha_pattern": "alpha_pattern (per-module alphas)",
    }
    for key, what in refusals.items():
        if config.get(key):
            raise LoRAAdapterError(f"adapter {folder} has {what}, which ember does not serve; merge the adapter into the "
                                   "weights (peft's merge_and_unload) and serve the merged model")
    if config.get("bias", "none") != "none":
        raise LoRAAdapterError(f"adapter {folder} trains biases (bias: {config['bias']!r}); ember serves bias: \"none\" "
                               "adapters only: merge it into the weights and serve the merged model")
    if config.get("fan_in_fan_out"):
        raise LoRAAdapterError(f"adapter {folder} has fan_in_fan_out: true (GPT-2 Conv1D layers), which ember does not serve")
    return config


def read_adapter_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors from adapter_model.safetensors, else adapter_model.bin (tensors only, no code run)."""
    safetensors_path, bin_path = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    if safetensors_path.is_file():
        return load_file(safetensors_path)
    if bin_path.is_file():
        return torch.load(bin_path, map_location="cpu", weights_only=True)
    raise LoRAAdapterError(f"{folder} has neither adapter_model.safetensors nor adapter_model.bin")


def load_lora_adapter(folder: str | Path, model: CausalLM, max_rank: int, dtype: torch.dtype = torch.float32) -> LoRAAdapter:
    """Read the PEFT adapter in `folder` for `model` (products in `dtype`); LoRAAdapterError naming what is refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LoRAAdapterError(f"LoRA adapter path {folder} is not a folder: give the folder with adapter_config.json")
    config = read_adapter_config(folder)
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", 8))
    if rank > max_rank:
        raise LoRAAdapterError(f"adapter {folder} has rank {rank}, above max_lora_rank {max_rank}: "
                               f"start the engine with max_lora_rank={_next_power_of_two(rank)} (--max-lora-rank)")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = adaptable_modules(model)
    _check_target_modules(config.get("target_modules"), folder, targets)
    pairs = _lora_pairs(read_adapter_tensors(folder), folder, targets)
    return LoRAAdapter(folder, rank, _fused_products(pairs, targets, scaling, dtype))


def _check_target_modules(target_modules: object, folder: Path, targets: dict[str, AdaptedModule]) -> None:
    """Every module name in the config's `target_modules` list names a linear of this family (a regex is checked
    through the tensors it produced)."""
    if not isinstance(target_modules, list):
        return
    adaptable = sorted({target.rsplit(".", 1)[-1] for target in targets})
    for name in target_modules:
        if name not in adaptable and not any(target.endswith(f".{name}") for target in targets):
            raise LoRAAdapterError(_lacking(folder, name, adaptable))


def _lacking(folder: Path, module: str, adaptable: list[str]) -> str:
    return (f"adapter {folder} targets {module!r}, which this model family has no adaptable linear for (embeddings, "
            f"the LM head and experts are not adapted); target_modules may name: {', '.join(adaptable)}")


def _lora_pairs(
    tensors: dict[str, torch.Tensor], folder: Path, targets: dict[str, AdaptedModule]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """transformers module name -> (A, B), every tensor accounted for (refused by name otherwise)."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(PEFT_PREFIX)
        module, dot, kind = name.rpartition(".lora_")
        if not dot or kind not in ("A.weight", "B.weight"):
            raise LoRAAdapterError(f"adapter {folder} holds {key!r}, which ember does not serve (only lora_A / lora_B "
                                   "weights of linear layers: no embedding, LM-head or DoRA tensors)")
        if module not in targets:
            raise LoRAAdapterError(_lacking(folder, module, sorted({target.rsplit(".", 1)[-1] for target in targets})))
        halves.setdefault(module, {})[kind[0]] = tensor
    incomplete = sorted(module for module, pair in halves.items() if len(pair) != 2)
    if incomplete:
        raise LoRAAdapterError(f"adapter {folder} has lora_A without lora_B (or the reverse) for {incomplete[0]!r}")
    return {module: (pair["A"], pair["B"]) for module, pair in halves.items()}


def _fused_products(
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], targets: dict[str, AdaptedModule], scaling: float, dtype: torch.dtype
) -> dict[str, LoRAProduct]:
    """One product per ember linear: the adapted parts' A stacked, each part's B a segment of the output rows."""
    by_linear: dict[str, list[tuple[AdaptedModule, torch.Tensor, torch.Tensor]]] = {}
    for module, (a, b) in pairs.items():
        by_linear.setdefault(targets[module].module_name, []).append((targets[module], a, b))
    products = {}
    for linear_name, parts in by_linear.items():
        parts.sort(key=lambda part: part[0].part)
        sizes = parts[0][0].part_sizes
        offsets = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        segments = []
        for index, (target, a, b) in enumerate(parts):
            if b.shape != (sizes[target.part], a.shape[0]) or a.shape[1] != target.in_features or a.shape[0] != parts[0][1].shape[0]:
                raise LoRAAdapterError(f"adapter of {linear_name} part {target.part} has A {tuple(a.shape)} and B {tuple(b.shape)}; "
                                       f"the model's layer takes {target.in_features} inputs and gives {sizes[target.part]} "
                                       "outputs: an adapter trained on another base model?")
            segments.append((offsets[target.part], offsets[target.part + 1], index * a.shape[0]))
        stacked_a = torch.cat([a.to(dtype) for _, a, _ in parts])
        products[linear_name] = LoRAProduct.of_parts(stacked_a, [(b.float() * scaling).to(dtype) for _, _, b in parts], segments)
    return products


def _next_power_of_two(value: int) -> int:
    return 1 << (value - 1).bit_length()
