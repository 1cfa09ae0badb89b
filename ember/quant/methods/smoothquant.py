"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights, then run W8A8.

A few input channels of an LLM's linears carry activations 10-100x the others, so rounding a
token's activations to int8 with one scale loses the small channels. Per input channel j,
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (maxima over the calibration tokens and over the
weight's rows) divides the activations and multiplies the weights: X W^T = (X / s)(W s)^T, so
the float model is unchanged while the activations flatten (alpha = 1 moves all of the range
into the weights, alpha = 0 none of the activations'). 1/s is folded into the op that produces X:

- q/k/v (one fused weight) read the input norm: its weight absorbs 1/s (Gemma's (1 + weight) too);
- gate/up read the MLP's input norm (post-attention in Llama and Gemma 1, pre-feed-forward in Gemma 2 / 3): same;
- down reads silu(gate) * up: up_proj's rows absorb 1/s (the product is linear in up).

o_proj is not smoothed: its input is attention's output, which only v_proj's rows could absorb,
and with grouped-query attention one v channel feeds several o channels, which would need equal
scales. Channels that never fired in calibration (max |X_j| = 0), or whose weight column is
zero, keep s_j = 1.
"""

from __future__ import annotations

import torch
from rich.progress import Progress
from torch import nn

from ember.quant.methods.calibration import InputStats


def smoothing_scales(activation_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [cols] for a linear of weight [rows, cols] whose inputs reached `activation_max` [cols] per channel."""
    weight_max = weight.detach().abs().amax(dim=0).float()
    activation_max = activation_max.float()
    is_live = (activation_max > 0) & (weight_max > 0)
    scales = activation_max.clamp(min=1e-12).pow(alpha) / weight_max.clamp(min=1e-12).pow(1.0 - alpha)
    return torch.where(is_live, scales, torch.ones_like(scales))


Feeder = nn.Module | torch.Tensor  # a norm (its `divide_output_`), or rows of up_proj


def fold_scales(weight: torch.Tensor, feeder: Feeder, scales: torch.Tensor) -> None:
    """W <- W s (columns), in place; `feeder` absorbs 1/s: a norm divides its output, up_proj's rows (dim 0 indexing
    the input channels) are divided."""
    with torch.no_grad():
        weight.mul_(scales)
        if isinstance(feeder, torch.Tensor):
            feeder.div_(scales.reshape(-1, *[1] * (feeder.dim() - 1)))
        else:
            feeder.divide_output_(scales)


def apply_smoothing(model: nn.Module, stats: dict[str, InputStats], alpha: float, progress: Progress) -> None:
    """Smooth the inputs of every decoder layer's qkv, gate_up and down projections (see the module docstring)."""
    from ember.layers.cpu_prepare import restore_dense_weights

    restore_dense_weights(model)  # the CPU kernels' panels cannot be scaled in place
    layers = model.model.layers
    task = progress.add_task(f"SmoothQuant migration (alpha {alpha:g})", total=len(layers))
    for index, layer in enumerate(layers):
        for name, (linear, feeder) in smoothing_targets(layer).items():
            scales = smoothing_scales(stats[f"model.layers.{index}.{name}"].abs_max, linear.weight, alpha)
            fold_scales(linear.weight, feeder, scales)
        progress.advance(task)


def folds_input_scales(model: nn.Module) -> bool:
    """Whether the model (an ember.models CausalLM) names the norms feeding each layer's attention and MLP
    (`input_norms()`: the Llama family, Gemma 1/2/3), into which AWQ and SmoothQuant fold their scales."""
    return model.input_norms() is not None


def smoothing_targets(layer: nn.Module) -> dict[str, tuple[nn.Linear, Feeder]]:
    """A decoder layer's smoothed linears, by name within the layer, each with what absorbs its 1/s."""
    attention, mlp = layer.self_attn, layer.mlp
    attention_norm, mlp_norm = layer.input_norms()
    return {
        "self_attn.qkv_proj": (attention.qkv_proj, attention_norm),
        "mlp.gate_up_proj": (mlp.gate_up_proj, mlp_norm),
        "mlp.down_proj": (mlp.down_proj, mlp.gate_up_proj.weight[mlp.down_proj.in_features :]),
    }


def migrated_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor apply_smoothing rescales (dense weights, restored first; feeders may be views into them)."""
    from ember.layers.cpu_prepare import restore_dense_weights

    restore_dense_weights(model)
    return [tensor for layer in model.model.layers for linear, feeder in smoothing_targets(layer).values()
            for tensor in (linear.weight, feeder if isinstance(feeder, torch.Tensor) else feeder.weight)]
