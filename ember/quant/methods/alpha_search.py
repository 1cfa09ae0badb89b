"""SmoothQuant's migration strength chosen on the calibration text (`ember quantize --alpha auto`).

The alpha that works differs by model: the SmoothQuant paper uses 0.5 for OPT and BLOOM and 0.8-0.85
for others, and on SmolLM2 one measurement gave +2.8% perplexity at 0.5, +0.7% at 0.8 and +3.1% at
0.85. So rather than guess, each of ALPHA_CANDIDATES is migrated into the float model, the model is
run as W8A8 (every quantized linear's output replaced by the W8A8 product of its input: per-token
int8 activations, per-channel int8 weights, the W8A8 layers' torch reference), and the calibration
text's mean negative log-likelihood per token is scored; the lowest wins. The embedding (and a tied LM
head) stays float while scoring: the checkpoint rounds it to Q8_0 the same way whatever alpha is. The migrated tensors are
restored between candidates, so the model leaves as it came. Scoring the calibration text, never the
evaluation text, keeps `ember bench quant`'s evaluation honest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.progress import Progress
from torch import nn

from ember.quant.int8.channel import quantize_weight, w8a8_linear_torch
from ember.quant.methods.calibration import CalibrationRun, InputStats
from ember.quant.methods.smoothquant import apply_smoothing, migrated_tensors

ALPHA_CANDIDATES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class AlphaSearch:
    """The chosen alpha and every candidate's mean NLL per calibration token as W8A8."""

    alpha: float
    nll: dict[float, float]


def search_alpha(run: CalibrationRun, model: nn.Module, names: list[str], chunks: list[list[int]], stats: dict[str, InputStats],
                 progress: Progress) -> AlphaSearch:
    """Score each candidate alpha's W8A8 model on the calibration chunks; the model's weights are left unchanged."""
    touched = migrated_tensors(model)
    saved = [tensor.detach().clone() for tensor in touched]
    task = progress.add_task("SmoothQuant alpha search", total=len(ALPHA_CANDIDATES))
    scores: dict[float, float] = {}
    for alpha in ALPHA_CANDIDATES:
        try:
            with Progress(disable=True) as quiet:
                apply_smoothing(model, stats, alpha, quiet)
            scores[alpha] = w8a8_nll(run, model, names, chunks, f"alpha-{alpha:g}")
        finally:
            _restore(touched, saved)
        progress.advance(task)
    return AlphaSearch(min(scores, key=scores.__getitem__), scores)


def w8a8_nll(run: CalibrationRun, model: nn.Module, names: list[str], chunks: list[list[int]], tag: str) -> float:
    """Mean NLL per token of the chunks with every named linear run as W8A8 on its current weights."""
    hooks = [_run_as_w8a8(model.get_submodule(name)) for name in names]
    try:
        with torch.inference_mode():
            nll = [value for index, chunk in enumerate(chunks) for value in run.token_nll(f"{tag}-{index}", chunk)]
    finally:
        for hook in hooks:
            hook.remove()
    return sum(nll) / len(nll)


def _run_as_w8a8(linear: nn.Module) -> torch.utils.hooks.RemovableHandle:
    """A forward hook replacing the linear's output by the W8A8 product of its input."""
    weight = quantize_weight(linear.weight)

    def w8a8_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        x = args[0]
        bias = None if module.bias is None else module.bias.float()
        return w8a8_linear_torch(x.reshape(-1, x.shape[-1]).float(), weight, bias).reshape(output.shape).to(output.dtype)

    return linear.register_forward_hook(w8a8_output)


def _restore(tensors: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for tensor, value in zip(tensors, saved, strict=True):
            tensor.copy_(value)
