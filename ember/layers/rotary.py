"""Rotary position embedding (RoPE) in the half-split layout transformers uses."""

from __future__ import annotations

import math

import torch

from ember.config.model import RopeScaling
from ember.layers.cpu_elementwise import load_elementwise
from ember.layers.triton_kernels import kernels_for


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Per-pair rotation frequencies, rescaled as the model's rope scaling says."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind in ("frequency_factors", "longrope"):  # longrope: its short factors (`rotation_angles` adds the long)
        return _divided(inv_freq, scaling.frequency_factors)
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    is_medium = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(is_medium, blended, scaled)


def _divided(inv_freq: torch.Tensor, factors: tuple[float, ...]) -> torch.Tensor:
    if len(factors) != inv_freq.numel():
        raise ValueError(f"{len(factors)} rope frequency factors for {inv_freq.numel()} rotation pairs "
                         f"(head_dim {2 * inv_freq.numel()}); the checkpoint's factors do not fit its heads")
    return inv_freq / torch.tensor(factors, dtype=torch.float64, device=inv_freq.device)


def rotation_angles(head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None, device: str = "cpu") -> torch.Tensor:
    """[max_positions, head_dim / 2] angles: each position times each pair's frequency.

    LongRoPE: the long factors for a context (`max_positions`, the engine's max_model_len) longer than the original,
    as vLLM picks them from max_model_len and llama.cpp from its context size. transformers picks them per sequence,
    from its current length (recomputing a cached one that grows past the original context): the same numbers for
    any sequence longer than the original context, and for every sequence when the context is within the original.
    """
    inv_freq = rope_inverse_frequencies(head_dim, theta, scaling).to(device)
    if scaling is not None and scaling.kind == "longrope" and max_positions > scaling.original_max_position_embeddings:
        inv_freq = _divided(rope_inverse_frequencies(head_dim, theta, None), scaling.long_frequency_factors).to(device)
    return torch.outer(torch.arange(max_positions, dtype=torch.float64, device=device), inv_freq)


class RotaryEmbedding:
    """Rotates queries and keys by their absolute positions; cos/sin tables built once.

    A plain object, not a module: its tables are derived, never loaded, so they are built on
    a real device even while the model's parameters are still on the meta device. Like
    transformers, the rotation runs in the activations' dtype.
    """

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None, device: str = "cpu",
        rotary_dim: int | None = None,
    ) -> None:
        # Partial rotary (`rotary_dim` < head_dim): the leading dims rotate in their own half-split layout, the rest pass.
        self.rotary_dim = rotary_dim or head_dim
        angles = rotation_angles(self.rotary_dim, max_positions, theta, scaling, device)
        magnitude = 1.0 if scaling is None or scaling.kind != "longrope" else scaling.attention_factor
        # Full-width tables ([cos, cos], [sin, sin]) so a rotation is two products and a sum.
        self.cos = (torch.cat((angles.cos(), angles.cos()), dim=-1) * magnitude).float()
        self.sin = (torch.cat((angles.sin(), angles.sin()), dim=-1) * magnitude).float()

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim] -> both rotated."""
        return self.rotate(positions, q), self.rotate(positions, k)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, head_dim] rotated by each token's position (any number of heads)."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        rotating, passing = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        rotated_half = torch.cat((-rotating[..., half:], rotating[..., :half]), dim=-1)
        return torch.cat((rotating * cos + rotated_half * sin, passing), dim=-1)

    def rotate_(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`rotate` in place (x may be a view into a fused projection's output); returns x."""
        device_kernels = kernels_for(x)
        if device_kernels is not None and x.stride(2) == 1:
            return device_kernels.rotary_(x, positions, self.cos, self.sin, self.rotary_dim)
        ops = load_elementwise()
        if ops is None or not ops.rotary_(x, positions, self.cos, self.sin):
            x.copy_(self.rotate(positions, x))
        return x


class UnrotatedEmbedding(RotaryEmbedding):
    """A rotation by angle 0 at every position (cos 1, sin 0): a layer without positional rotation (SmolLM3's NoPE
    layers) runs the same code as its rotating neighbours, the compiled block included, and its queries and keys
    come out exactly as they went in (x * 1 + y * 0)."""

    def __init__(self, head_dim: int, max_positions: int, device: str = "cpu") -> None:
        self.rotary_dim = head_dim
        self.cos = torch.ones(max_positions, head_dim, device=device)  # a real device even while the model is on meta
        self.sin = torch.zeros(max_positions, head_dim, device=device)


def move_rotary_tables(model: torch.nn.Module, device: torch.device) -> None:
    """Move the cos/sin tables of every RotaryEmbedding a module of `model` holds to `device`: they are plain
    attributes (built on a real device while the parameters sit on meta), so `Module.to` does not see them."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, RotaryEmbedding):
                value.cos, value.sin = value.cos.to(device), value.sin.to(device)
