"""`ember quantize`: float checkpoint -> calibration -> method -> GGML blocks -> a checkpoint ember loads.

Steps: the model in float32 runs in ember's engine (built and driven by ember.quantize, the floor above,
through `CalibrationRun`); for GPTQ/AWQ/SmoothQuant, run the
calibration text through it and gather each linear's input statistics (ember.quant.methods.calibration);
AWQ and SmoothQuant rescale weights and fold the inverse scales into the ops that feed them;
every linear of the decoder is then rounded by RTN or GPTQ onto a block grid (ember.quant.codes.grid),
or for SmoothQuant to int8 per output channel (W8A8 layers, ember.quant.int8.channel), and the
embedding (with a tied LM head) is stored as Q8_0. The result is written by
ember.quant.checkpoint into a temporary folder renamed to --out only when complete.

AWQ and SmoothQuant calibrate on the float model's activations for every layer at once (one
pass over the text, a chunk per engine step), as AWQ's reference does. GPTQ quantizes
sequentially, as its paper does (Frantar et al. 2022, section 5): each linear's Hessian comes
from the inputs it gets from the already-quantized linears before it. All calibration chunks go
through the model in ONE engine step; a hook on each linear, called with all of the batch's
inputs, builds H, runs GPTQ and writes the rounded weights back before the linear runs, so
every later linear (o_proj after qkv_proj, the next layer after this one) sees their effect.
The price is memory for all calibration tokens at once: their activations and KV cache
(about 70 KB per token for SmolLM2 in float32, 0.3 GB for the default 4096 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from rich.progress import Progress
from torch import nn

from ember.quant.at_load import decoder_linears
from ember.quant.checkpoint import SourceNames, write_quantized
from ember.quant.codes.float_codes import quantize_fp8, quantize_nf4
from ember.quant.codes.grid import BlockGrid
from ember.quant.config import ALPHA_AUTO, CALIBRATED_METHODS, MIN_CALIB_TOKENS, QuantizeConfig
from ember.quant.ggml.blocks import GGMLTensor
from ember.quant.int8.channel import Int8ChannelTensor, quantize_weight
from ember.quant.methods.alpha_search import search_alpha
from ember.quant.methods.awq import awq_clipped_ranges, awq_scales
from ember.quant.methods.calibration import Calibration, CalibrationRun, InputStats
from ember.quant.methods.gptq import GPTQSettings, gptq_quantize
from ember.quant.methods.smoothquant import (
    apply_smoothing,
    fold_scales,
    folds_input_scales,
    smoothing_targets,
)

EMBEDDING_GRID = BlockGrid(bits=8, group_size=32)
# AWQ and SmoothQuant fold their input scales into the norm before qkv / gate_up and into up_proj (smoothquant.py).
FOLDING_METHODS = ("awq", "smoothquant")
FLOAT_CODE_QUANTIZERS = {"nf4": quantize_nf4, "fp8": quantize_fp8}


@dataclass
class QuantizeResult:
    """Where the checkpoint went and what it holds."""

    out: Path
    quantized_bytes: int
    float_bytes: int
    num_parameters: int
    calib_tokens: int

    @property
    def bytes_per_parameter(self) -> float:
        return (self.quantized_bytes + self.float_bytes) / self.num_parameters


@dataclass(frozen=True)
class QuantizeTarget:
    """The source checkpoint as ember.models reads it (the floor above hands it down): where it lies, its tensor
    names, the formats its family writes back, and every family `ember quantize` takes (for a refusal)."""

    path: Path
    names: SourceNames
    formats: tuple[str, ...]
    quantizable: tuple[str, ...]


def quantize_model(run: CalibrationRun, model: nn.Module, model_config, tokenizer, config: QuantizeConfig,
                   target: QuantizeTarget, show_progress: bool = True) -> QuantizeResult:
    """Quantize the float32 `model` (running in the engine `run` drives) by `config.method` and write the checkpoint."""
    from ember.layers.cpu_prepare import restore_dense_weights

    restore_dense_weights(model)  # AWQ scales the weights in place, GPTQ writes them back, and every method reads them dense
    _check_family(model_config.architecture, target, config, model)
    names = decoder_linears(model)
    notes: dict = {}
    with Progress(disable=not show_progress) as progress:
        chunks: list[list[int]] = []
        if config.method in CALIBRATED_METHODS:
            if tokenizer is None:
                raise ValueError(f"{config.model} has no tokenizer to read --calib with; give --tokenizer FILE")
            chunks = calibration_chunks(tokenizer, config)
        embedding_name, embedding_table = _input_embedding(model)
        embedding = EMBEDDING_GRID.round_to_blocks(embedding_table.weight)
        if config.method == "gptq":
            with torch.no_grad():  # the first layer's inputs come from the embedding as it will run
                embedding_table.weight.copy_(embedding.dequantize())
            blocks, notes = gptq_sequential(run, model, names, chunks, config, progress)
        elif config.method == "smoothquant":
            config, blocks, notes = _smooth_and_round(run, model, names, chunks, config, progress)
        else:
            blocks = _rescale_and_round(run, model, names, chunks, config, progress)
    blocks[f"{embedding_name}.weight"] = embedding
    if not model_config.tie_word_embeddings:
        blocks["lm_head.weight"] = EMBEDDING_GRID.round_to_blocks(model.lm_head.weight)
    calib_tokens = sum(map(len, chunks))
    written = write_quantized(target.path, target.names, model, model_config, blocks, config, calib_tokens, notes)
    return QuantizeResult(config.out, *written, calib_tokens)


class FamilyRefused(ValueError):
    """The method (or the writer) cannot take this model's family: another method or source may (the message says)."""


def _check_family(architecture: str, target: QuantizeTarget, config: QuantizeConfig, model: nn.Module) -> None:
    """Raise, naming the fix, where the method or the writer cannot take this family."""
    formats = target.formats  # the checkpoints it writes back: every decoder linear rounded
    if not formats:
        raise FamilyRefused(f"ember quantize runs {', '.join(target.quantizable)}; {config.model} is {architecture}")
    if config.method in FOLDING_METHODS and not folds_input_scales(model):
        raise FamilyRefused(f"--method {config.method} folds its scales into the norms before attention and the MLP, which "
                            f"{config.model} ({architecture}: experts or post-norm blocks) does not have: use --method gptq, "
                            "rtn, nf4 or fp8")
    if "gguf" not in formats and target.path.is_file():
        raise FamilyRefused(f"ember quantize writes GGUFs of the Llama family; {config.model} is a {architecture} GGUF: "
                         "quantize its HF folder instead")


def _input_embedding(model: nn.Module) -> tuple[str, nn.Module]:
    """The token embedding table and its module name."""
    table = model.input_embedding()
    return next(name for name, module in model.named_modules() if module is table), table


def _rescale_and_round(run: CalibrationRun, model: nn.Module, names: list[str], chunks: list[list[int]], config: QuantizeConfig,
                       progress: Progress) -> dict[str, GGMLTensor | Int8ChannelTensor]:
    """RTN, NF4, FP8, or AWQ (rescaling from float-model statistics, then clipped rounding); each linear rounded on its own."""
    if config.method == "awq":
        stats = calibrate(run, model, names, chunks, progress)
        scales = apply_awq(model, stats, config.grid, progress)
        return round_with_clipping(model, names, stats, scales, config.grid, progress)
    return quantize_linears(model, names, config, progress)


def _smooth_and_round(run: CalibrationRun, model: nn.Module, names: list[str], chunks: list[list[int]], config: QuantizeConfig,
                      progress: Progress) -> tuple[QuantizeConfig, dict[str, GGMLTensor | Int8ChannelTensor], dict]:
    """SmoothQuant: migration at config.alpha (with --alpha auto, the candidate the calibration text prefers), then
    int8 rows. Returns the config with the alpha applied, the rows, and the search's scores for the description."""
    stats = calibrate(run, model, names, chunks, progress, with_hessian=False)
    notes: dict = {}
    if config.alpha == ALPHA_AUTO:
        search = search_alpha(run, model, names, chunks, stats, progress)
        config = replace(config, alpha=search.alpha)
        notes["alpha_search"] = {"candidates_nll": {f"{alpha:g}": nll for alpha, nll in search.nll.items()}, "chosen": search.alpha}
    apply_smoothing(model, stats, config.alpha, progress)
    return config, quantize_linears(model, names, config, progress), notes


def calibration_chunks(tokenizer, config: QuantizeConfig) -> list[list[int]]:
    """The first `calib_tokens` tokens of the calibration file, in sequences of `seq_len - 1` tokens."""
    text = config.calib.read_text(encoding="utf-8", errors="replace")
    tokens = tokenizer.encode(text[: config.calib_tokens * 12])[: config.calib_tokens]
    if len(tokens) < MIN_CALIB_TOKENS:
        raise ValueError(f"calibration file {config.calib} holds {len(tokens)} tokens; {config.method} needs at least {MIN_CALIB_TOKENS}: give a longer text")
    step = config.seq_len - 1  # one slot left for the token the engine samples
    return [tokens[i : i + step] for i in range(0, len(tokens), step) if len(tokens[i : i + step]) >= 16]


def calibrate(run: CalibrationRun, model: nn.Module, names: list[str], chunks: list[list[int]], progress: Progress,
              with_hessian: bool = True) -> dict[str, InputStats]:
    """Prefill every chunk through the float model, hooks gathering each linear's input statistics."""
    from ember.layers.cpu_prepare import restore_dense_weights

    restore_dense_weights(model)  # the hooks see a linear's input only on the Python path, not in a compiled layer

    task = progress.add_task("calibrating", total=len(chunks))

    def feed() -> None:
        run.prefill_each(chunks, lambda: progress.advance(task))

    calibration = Calibration(with_hessian=with_hessian)
    with torch.inference_mode():
        calibration.run(model, names, feed)
    return calibration.stats


def gptq_sequential(run: CalibrationRun, model: nn.Module, names: list[str], chunks: list[list[int]], config: QuantizeConfig,
                    progress: Progress) -> tuple[dict[str, GGMLTensor], dict]:
    """GPTQ on every named linear in order, inside one forward pass of all `chunks` (one engine step):
    each linear's Hessian is built from the inputs the already-quantized linears before it produce. An expert no
    calibration token was routed to has no Hessian: it is rounded to nearest, and the notes list it."""
    # The caller restored the dense weights: hooks see a linear's input only on the Python path,
    # and the rounded weights are written back into them.
    grid, settings = config.grid, GPTQSettings(damp=config.damp, act_order=config.act_order)
    task = progress.add_task(f"GPTQ, layer by layer ({config.bits}-bit, g{config.group_size})", total=len(names))
    blocks: dict[str, GGMLTensor] = {}

    def quantize_in_place(module: nn.Module, args: tuple, name: str) -> None:
        if f"{name}.weight" in blocks:
            raise RuntimeError(f"GPTQ saw {name}'s inputs twice: the calibration batch was split across engine steps")
        grid.check_width(module.weight.shape[1], name)
        inputs = InputStats.empty(module.in_features)
        inputs.add(args[0])
        codes, d, m = gptq_quantize(module.weight, inputs.mean_hessian, grid, settings)
        cols = codes.shape[1]
        module.weight.copy_(grid.dequantize(codes, grid.per_column(d, cols), grid.per_column(m, cols)))
        blocks[f"{name}.weight"] = grid.to_blocks(codes, d, m)
        progress.advance(task)

    handles = [model.get_submodule(name).register_forward_pre_hook(lambda module, args, name=name: quantize_in_place(module, args, name))
               for name in names]
    try:
        with torch.inference_mode():
            run.prefill_together(chunks)
    finally:
        for handle in handles:
            handle.remove()
    missing = [name for name in names if f"{name}.weight" not in blocks]
    unrouted = [name for name in missing if ".experts." in name]
    if len(unrouted) < len(missing):
        raise RuntimeError(f"GPTQ never saw the inputs of {', '.join(missing[:3])}: the model did not run its Python path")
    for name in unrouted:
        blocks[f"{name}.weight"] = grid.round_to_blocks(model.get_submodule(name).weight)
        progress.advance(task)
    return blocks, {"experts_without_calibration_tokens": unrouted} if unrouted else {}


def apply_awq(model: nn.Module, stats: dict[str, InputStats], grid: BlockGrid, progress: Progress) -> dict[str, torch.Tensor]:
    """Scale each layer's qkv, gate_up and down inputs by AWQ's search; the feeding op absorbs 1/s.

    Returns each scaled linear's s: its inputs are now x / s."""
    from ember.layers.cpu_prepare import restore_dense_weights

    restore_dense_weights(model)  # the CPU kernels' panels cannot be scaled in place
    layers = model.model.layers
    task = progress.add_task("AWQ scale search", total=len(layers))
    scales = {}
    for index, layer in enumerate(layers):
        for name, (linear, feeder) in smoothing_targets(layer).items():  # the linears whose inputs a feeder can absorb
            name = f"model.layers.{index}.{name}"
            with torch.no_grad():
                scales[name] = awq_scales([linear.weight], stats[name].mean_hessian, stats[name].mean_abs, grid)
            fold_scales(linear.weight, feeder, scales[name])
        progress.advance(task)
    return scales


def round_with_clipping(model: nn.Module, names: list[str], stats: dict[str, InputStats], scales: dict[str, torch.Tensor],
                        grid: BlockGrid, progress: Progress) -> dict[str, GGMLTensor]:
    """AWQ's rounding: every named linear on the grid with its groups' ranges clipped by the output-error search,
    against its inputs as scaled (H / s s^T)."""
    task = progress.add_task(f"AWQ clipping search ({grid.bits}-bit, g{grid.group_size})", total=len(names))
    blocks = {}
    for name in names:
        weight = model.get_submodule(name).weight.detach().float()
        grid.check_width(weight.shape[1], name)
        s = scales.get(name, torch.ones(weight.shape[1]))
        hessian = stats[name].mean_hessian / torch.outer(s, s)
        blocks[f"{name}.weight"] = grid.round_to_blocks(weight, *awq_clipped_ranges(weight, hessian, grid))
        progress.advance(task)
    return blocks


def quantize_linears(model: nn.Module, names: list[str], config: QuantizeConfig, progress: Progress) -> dict[str, GGMLTensor | Int8ChannelTensor]:
    """Every named linear rounded on its own: NF4/FP8 codes, int8 rows (SmoothQuant), else RTN on the grid."""
    if config.method in FLOAT_CODE_QUANTIZERS:
        return _quantize_float_codes(model, names, config, progress)
    if config.method == "smoothquant":
        return _quantize_int8_rows(model, names, progress)
    grid = config.grid
    task = progress.add_task(f"quantizing ({config.method}, {config.bits}-bit, g{config.group_size})", total=len(names))
    blocks = {}
    for name in names:
        weight = model.get_submodule(name).weight.detach()
        grid.check_width(weight.shape[1], name)
        blocks[f"{name}.weight"] = grid.round_to_blocks(weight)
        progress.advance(task)
    return blocks


def _quantize_float_codes(model: nn.Module, names: list[str], config: QuantizeConfig, progress: Progress) -> dict[str, GGMLTensor]:
    quantize = FLOAT_CODE_QUANTIZERS[config.method]
    task = progress.add_task(f"quantizing ({config.method})", total=len(names))
    blocks = {}
    for name in names:
        blocks[f"{name}.weight"] = quantize(model.get_submodule(name).weight.detach())
        progress.advance(task)
    return blocks


def _quantize_int8_rows(model: nn.Module, names: list[str], progress: Progress) -> dict[str, GGMLTensor | Int8ChannelTensor]:
    task = progress.add_task("quantizing (W8A8, int8 per output channel)", total=len(names))
    rows: dict[str, GGMLTensor | Int8ChannelTensor] = {}
    for name in names:
        rows[f"{name}.weight"] = quantize_weight(model.get_submodule(name).weight)
        progress.advance(task)
    return rows
