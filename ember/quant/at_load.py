"""Quantization while a float checkpoint loads (`--quantization`, as vLLM's in-flight fp8 and bitsandbytes).

No file is written: each linear of the decoder layers is rounded to nearest onto a block format as its float weight
arrives, and the model runs on the same layers and kernels as a GGUF file. `ember quantize` does the same offline,
and with calibrated methods (GPTQ, AWQ, SmoothQuant) that in-flight rounding cannot run.

- `int8`: Q8_0 (an fp16 scale per 32 values; 1.06 bytes a parameter), the closest to the float model;
- `int4`: Q4_1 (fp16 scale and minimum per 32 values; 0.63 bytes);
- `fp8`: e4m3 codes with a power-of-two scale per 32 values (ember's FP8 blocks);
- `nf4` (vLLM's name: `bitsandbytes`): NormalFloat-4 codes with an fp16 absmax per 64 values (QLoRA's).

The LM head and the embeddings stay as loaded, as vLLM keeps them. Names of checkpoint methods (gptq, awq, gguf, ...)
are accepted as vLLM takes them: they assert the checkpoint is quantized that way and change nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ember.layers.linear import Linear
from ember.quant.choices import CHECKPOINT_QUANTIZATIONS
from ember.quant.codes.float_codes import quantize_fp8, quantize_nf4
from ember.quant.codes.grid import BlockGrid
from ember.quant.ggml.blocks import GGMLTensor
from ember.quant.ggml.layers import LOGITS_MODULE

logger = logging.getLogger(__name__)

AT_LOAD_QUANTIZERS: dict[str, Callable[[torch.Tensor], GGMLTensor]] = {  # keys: ember.quant.choices.AT_LOAD_QUANTIZATIONS
    "int8": BlockGrid(bits=8, group_size=32).round_to_blocks,
    "int4": BlockGrid(bits=4, group_size=32).round_to_blocks,
    "fp8": quantize_fp8,
    "nf4": quantize_nf4,
}


def decoder_linears(model: nn.Module) -> list[str]:
    """Every linear of the decoder layers in the order they run (attention, MLP, each expert's): ember's `Linear`s but
    the LM head. Routers (plain nn.Linear: a rounded router picks other experts) and weights read as matrices (MLA's
    kv_b_proj) stay float."""
    return [name for name, module in model.named_modules() if isinstance(module, Linear) and name != LOGITS_MODULE]


def weights_rounded_at_load(model: nn.Module, quantization: str | None) -> frozenset[str]:
    """Names of the weights `quantization` rounds as they load: the decoder linears' (none without an at-load one)."""
    if quantization not in AT_LOAD_QUANTIZERS:
        return frozenset()
    return frozenset(f"{module}.weight" for module in decoder_linears(model))


def round_at_load(name: str, weight: torch.Tensor, quantization: str) -> GGMLTensor | None:
    """`weight` rounded by `quantization`; None where the blocks cannot take its width (it stays float: a warning
    names it)."""
    try:
        return AT_LOAD_QUANTIZERS[quantization](weight)
    except ValueError as error:
        logger.warning("%s stays float: %s", name.removesuffix(".weight"), error)
        return None


def check_checkpoint_method(quantization: str | None, num_quantized: int, path: Path | None) -> None:
    """A checkpoint method named by `--quantization` must be what the checkpoint holds (as vLLM checks)."""
    if quantization in CHECKPOINT_QUANTIZATIONS and num_quantized == 0:
        raise ValueError(f"--quantization {quantization} names a checkpoint format, but {path} holds float weights: drop "
                         "--quantization, or pass fp8, int8, int4 or nf4 to quantize it while it loads")
