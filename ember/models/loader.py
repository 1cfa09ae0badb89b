"""One entry point from a checkpoint path to a ready model: format found by content, weights lazy."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress
from torch import nn

from ember.config.model import ModelConfig
from ember.gguf_file import GGUFFile
from ember.layers.cpu_prepare import prepare_for_cpu_kernels
from ember.layers.rotary import move_rotary_tables
from ember.models.causal_lm import CausalLM
from ember.models.family_registry import family_of
from ember.models.gguf_loader import (
    gguf_source_names,
    is_gguf_file,
    iter_gguf_tensors,
    read_gguf_config,
)
from ember.models.hf_loader import (
    find_hf_tokenizer,
    hf_source_names,
    is_hf_folder,
    iter_hf_tensors,
    read_hf_config,
)
from ember.models.llama2c_loader import (
    is_llama2c_file,
    iter_llama2c_tensors,
    llama2c_config,
    read_llama2c_header,
)
from ember.models.packing import PackingPlan
from ember.models.registry import single_gguf_in
from ember.models.shard import ModelShard
from ember.quant.at_load import check_checkpoint_method, round_at_load, weights_rounded_at_load
from ember.quant.checkpoint import QUANTIZATION_FILE, SourceNames, read_block_tensors
from ember.quant.ggml.blocks import GGMLRowParts, GGMLTensor
from ember.quant.ggml.layers import can_hold_blocks, install_ggml_layers
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.hf.gptq_awq import hf_quantization, read_quantized
from ember.quant.int8.channel import Int8ChannelTensor
from ember.quant.parts import quantized_part

logger = logging.getLogger(__name__)

Quantized = GGMLTensor | GGMLRowParts | Int8ChannelTensor | ZeroPointTensor
# A split model's rank: the whole model's config -> what this rank holds (ember.parallel.modes.shard_factory).
ShardFactory = Callable[[ModelConfig], ModelShard]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# "auto": quantized matrices the checkpoint holds stay quantized (ember.quant's layers), the rest float32.
AUTO_DTYPE = "auto"
LOAD_DTYPES = (AUTO_DTYPE, *DTYPES)


def compute_dtype(dtype: str) -> torch.dtype:
    """The dtype activations and the KV cache use under load dtype `dtype` ("auto" computes in float32)."""
    return DTYPES.get(dtype, torch.float32)


@dataclass
class LoadedModel:
    """A model with its weights in place, and where its tokenizer can be read from (if anywhere)."""

    model: CausalLM
    config: ModelConfig
    tokenizer_path: Path | None
    format: str
    shard: ModelShard | None = None  # what this rank holds of a split model (None: the whole model)


def load_model(
    path: Path, dtype: str = AUTO_DTYPE, show_progress: bool = False, shard_for: ShardFactory | None = None,
    max_model_len: int | None = None, quantization: str | None = None, device: torch.device | None = None,
) -> LoadedModel:
    """Load a GGUF file, an HF safetensors folder or a llama2.c .bin into ember's model.

    `dtype` "auto" keeps quantized weights in their blocks; a float dtype forces a float copy of every weight.
    With `shard_for` (a rank of a split model), this rank loads only what its shard holds
    (ember.parallel): its tensors, or slices of them, are all that is read from the file. `max_model_len`: the
    context it will serve (`ModelConfig.for_context`; None: the model's own). `quantization`: an
    `EngineConfig.quantization` (ember.quant.at_load rounds the float decoder linears as they load). `device`
    (None: the CPU): where each weight goes as it is read; on a GPU no block stays quantized and no CPU packing runs.
    """
    if dtype not in LOAD_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; choose one of {', '.join(LOAD_DTYPES)}")
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist; give a file, a folder or a registered name")
    path = single_gguf_in(path) or path  # e.g. `ember quantize`'s --out folder of a GGUF source
    if is_hf_folder(path):
        config = read_hf_config(path).for_context(max_model_len)
        layout = hf_quantization(path)  # GPTQ / AWQ / FP8 / W8A8: quantization_config in config.json
        shard = shard_for(config) if shard_for is not None else None
        if shard is None or layout is not None or (path / QUANTIZATION_FILE).is_file():
            tensors: Iterable[tuple[str, torch.Tensor | Quantized]] = read_block_tensors(
                path, iter_hf_tensors(path, keep=None if shard is None else shard.holds))
            if layout is not None:
                tensors = read_quantized(layout, tensors)
            tensors = _sliced(tensors, shard, float_parts=dtype != AUTO_DTYPE)  # a rank's parts of whole quantized weights
        else:  # a float checkpoint: a rank reads only its slices
            tensors = iter_hf_tensors(path, _selector(shard), shard.holds)
        return _build(config, tensors, dtype, find_hf_tokenizer(path), "safetensors", show_progress, shard=shard,
                      quantization=quantization, path=path, device=device)
    if is_gguf_file(path):
        file = GGUFFile.open(path)
        config = read_gguf_config(file).for_context(max_model_len)
        shard = shard_for(config) if shard_for is not None else None
        tokenizer_path = path if "tokenizer.ggml.model" in file.metadata else None
        tensors = iter_gguf_tensors(file, config, _selector(shard), None if shard is None else shard.holds, float_parts=dtype != AUTO_DTYPE)
        return _build(config, tensors, dtype, tokenizer_path, "gguf", show_progress, len(file.tensors), shard,
                      quantization=quantization, path=path, device=device)
    if is_llama2c_file(path):
        header = read_llama2c_header(path)
        config = llama2c_config(header).for_context(max_model_len)
        shard = shard_for(config) if shard_for is not None else None
        tensors = _sliced(iter_llama2c_tensors(path, header), shard)
        return _build(config, tensors, dtype, None, "llama2c", show_progress, shard=shard, quantization=quantization, path=path,
                      device=device)
    raise ValueError(
        f"{path} is not a model ember can read: expected a GGUF file (or a folder holding one), a folder "
        "with config.json and *.safetensors, or a llama2.c .bin checkpoint"
    )


def source_names(path: Path, config: ModelConfig) -> SourceNames:
    """The tensors of the checkpoint at `path` (a GGUF file or an HF safetensors folder) as a `config` model names them."""
    if is_gguf_file(path):
        return gguf_source_names(GGUFFile.open(path), config)
    return hf_source_names(path)


def _build(
    config: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor | Quantized]],
    dtype: str,
    tokenizer_path: Path | None,
    fmt: str,
    show_progress: bool,
    total: int | None = None,
    shard: ModelShard | None = None,
    quantization: str | None = None,
    path: Path | None = None,
    device: torch.device | None = None,
) -> LoadedModel:
    """`config` is the whole model's; a rank of a split model builds its model from its shard's local config."""
    torch_dtype = compute_dtype(dtype)
    device = device or torch.device("cpu")
    if device.type != "cpu" and dtype == AUTO_DTYPE:
        raise ValueError(f"a {device.type} model loads in a float dtype (no quantized kernels there): give one, not auto")
    with torch.device("meta"):
        model = model_class(config)(config if shard is None else shard.local_config())
        if shard is not None:
            shard.shard_modules(model)
    expected = dict(model.state_dict())
    state: dict[str, torch.Tensor] = {}
    blocks: dict[str, Quantized] = {}  # weights kept quantized, swapped into quantized layers below
    packing = PackingPlan.for_model(model, set(expected))
    num_quantized = 0  # weights the checkpoint holds quantized
    rounded_at_load = weights_rounded_at_load(model, quantization)  # each rounded as it arrives: one float copy at a time
    with Progress(disable=not show_progress, transient=True) as progress:
        task = progress.add_task("loading weights", total=total)
        for stored_name, checkpoint_tensor in tensors:
            progress.advance(task)
            checkpoint_name = _aliased(stored_name, model.checkpoint_prefixes)
            if checkpoint_name in packing.targets:
                fused = packing.add(checkpoint_name, checkpoint_tensor)
                if fused is None:
                    continue
                name, tensor = fused
            else:
                name, tensor = checkpoint_name, checkpoint_tensor
            if name not in expected:
                if model.is_derived_tensor(name):
                    continue  # derived, not a weight
                raise ValueError(f"checkpoint tensor {name!r} does not belong to a {config.architecture} model")
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}")
            if isinstance(tensor, (GGMLTensor, GGMLRowParts, Int8ChannelTensor, ZeroPointTensor)):
                num_quantized += 1
                if dtype == AUTO_DTYPE and _holds_blocks(model, name):
                    blocks[name] = tensor
                    continue
                tensor = tensor.dequantize()
            tensor = tensor.to(device=device, dtype=torch_dtype)
            rounded = round_at_load(name, tensor, quantization) if name in rounded_at_load else None
            if rounded is not None:
                blocks[name] = rounded
                continue
            state[name] = tensor
    check_checkpoint_method(quantization, num_quantized, path)
    tied_weights = dict(model.tied_weights) if config.tie_word_embeddings else {}
    for tied, source in tied_weights.items():
        if tied not in expected:
            continue  # a pipeline stage without the head
        if source in blocks and _holds_blocks(model, tied):
            blocks[tied] = blocks[source]  # one copy of the blocks, read by both layers
        else:
            state[tied] = blocks[source].dequantize() if source in blocks else state[source]
    missing = sorted(set(expected) - set(state) - set(blocks))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    install_ggml_layers(model, blocks)
    model.load_state_dict(state, assign=True)
    _freeze(model)
    if device.type == "cpu":
        prepare_for_cpu_kernels(model, tied_weights)
    else:
        move_rotary_tables(model, device)
        if num_quantized:
            logger.info("%d quantized %s tensors dequantized to %s at load: ember has no quantized %s kernels yet",
                        num_quantized, fmt, str(torch_dtype).removeprefix("torch."), device.type)
    del blocks, state  # the layers hold what they kept
    _return_freed_memory()
    return LoadedModel(model=model.eval(), config=config, tokenizer_path=tokenizer_path, format=fmt, shard=shard)


def _aliased(name: str, prefixes: Mapping[str, str]) -> str:
    """`name` with a checkpoint prefix the model names otherwise replaced (e.g. a bare OPTModel's `decoder.`)."""
    prefix = next((p for p in prefixes if name.startswith(p)), None)
    return name if prefix is None else prefixes[prefix] + name.removeprefix(prefix)


def _return_freed_memory() -> None:
    """Hand the heap pages freed while loading (checkpoint copies, GGUF-layout blocks a layer re-laid) back to the
    OS: glibc keeps them otherwise, and SmolLM2's 4-bit engine stayed ~70 MB larger than its live tensors."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return  # not glibc: nothing to ask
    trim(0)


def _holds_blocks(model: nn.Module, name: str) -> bool:
    """Whether the parameter `name` is the weight of a layer that can run GGML blocks."""
    module_path, _, leaf = name.rpartition(".")
    return leaf == "weight" and can_hold_blocks(model.get_submodule(module_path))


SliceSelector = Callable[[str], tuple[int, int, int] | None]


def _selector(shard: ModelShard | None) -> SliceSelector | None:
    """Checkpoint name -> (dim, start, stop) of this rank's part, for the format readers."""
    if shard is None:
        return None

    def select(name: str) -> tuple[int, int, int] | None:
        part = shard.slice_for(name)
        return None if part is None else (part.dim, part.start, part.stop)

    return select


def _sliced(
    tensors: Iterable[tuple[str, torch.Tensor | Quantized]], shard: ModelShard | None, float_parts: bool = False,
) -> Iterator[tuple[str, torch.Tensor | Quantized]]:
    """Drop and slice whole tensors after reading (formats that cannot read a part: llama2.c, quantized HF weights).

    A quantized weight's part stays quantized (ember.quant.parts, which refuses a split its format cannot take), or
    with `float_parts` is a float32 slice of its dequantized values."""
    for name, tensor in tensors:
        if shard is None:
            yield name, tensor
            continue
        if not shard.holds(name):
            continue
        part = shard.slice_for(name)
        if part is None:
            yield name, tensor
        elif isinstance(tensor, torch.Tensor):
            yield name, part.of(tensor).clone(memory_format=torch.contiguous_format)  # not a view holding the whole
        elif float_parts:
            yield name, part.of(tensor.dequantize()).clone(memory_format=torch.contiguous_format)
        else:
            yield name, quantized_part(tensor, part.dim, part.start, part.stop, name)


def model_class(config: ModelConfig) -> type[CausalLM]:
    """The family class that runs `config`."""
    return family_of(config.architecture).model_class


def _freeze(model: nn.Module) -> None:
    for parameter in model.parameters():
        parameter.requires_grad_(False)
