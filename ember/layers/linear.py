"""Dense linear layers; the CPU fast path is chosen here, so model files never branch on it."""

from __future__ import annotations

import torch
from torch import nn

from ember.layers import cpu_gemm
from ember.layers.weight_arena import WeightArena


class Linear(nn.Linear):
    """`nn.Linear` whose CPU products go through ember's compiled GEMM once `pack_weights()` ran.

    Packing (done by the loader after the weights are in place) replaces the dense weight by
    panels (`cpu_gemm.PackedWeight`): one copy in memory. Without the kernel (no compiler,
    EMBER_PURE_TORCH=1), other dtypes or devices, the layer stays a plain `nn.Linear`.
    """

    packed: cpu_gemm.PackedWeight | None = None

    def packable(self) -> bool:
        """Whether `pack_weights` would pack: a CPU weight of a dtype the compiled kernel takes, and the kernel."""
        weight = self.weight
        return weight is not None and weight.device.type == "cpu" and weight.dtype in cpu_gemm.PACKABLE_DTYPES and cpu_gemm.load_gemm() is not None

    def panel_shape(self) -> tuple[int, ...]:
        """The shape of this layer's packed panels (what `pack_weights` takes from an arena)."""
        return cpu_gemm.PackedWeight.panel_shape(self.out_features, self.in_features, self.weight.dtype)

    def pack_weights(self, arena: WeightArena | None = None) -> bool:
        """Pack the weight for the compiled kernel (into `arena` when given); False (nothing changed) where it cannot run."""
        if not self.packable():
            return False
        out = None if arena is None else arena.take(self.panel_shape(), self.weight.dtype)
        self.packed = cpu_gemm.PackedWeight.from_dense(self.weight.detach(), None if self.bias is None else self.bias.detach(), out=out)
        del self.weight, self.bias
        self.register_parameter("weight", None)
        self.register_parameter("bias", None)
        return True

    def compiled_product(self) -> cpu_gemm.CompiledProduct | None:
        """This layer's product for a compiled caller; None unpacked, or where a subclass's forward adds
        work (a tensor-parallel shard's communication) that a C caller of the bare product would skip."""
        if self.packed is None or type(self).forward is not Linear.forward:
            return None
        return self.packed.compiled_product()

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """A packed layer still reports nn.Linear's dense weight and bias (rebuilt from the panels)."""
        if self.packed is None:
            super()._save_to_state_dict(destination, prefix, keep_vars)
            return
        destination[prefix + "weight"] = self.packed.dense()
        if self.packed.bias is not None:
            destination[prefix + "bias"] = self.packed.bias[: self.packed.out_features].to(self.packed.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return super().forward(x)
        kernel = cpu_gemm.load_gemm()
        assert kernel is not None  # packing happened only where the kernel loaded
        out = kernel(x.reshape(-1, x.shape[-1]), self.packed)
        return out.view(*x.shape[:-1], self.packed.out_features).to(x.dtype)


def pack_linear_weights(model: nn.Module) -> int:
    """Pack every ember `Linear` of `model` for the compiled CPU kernel, all into one `WeightArena`
    (huge pages where the OS gives them); how many were packed."""
    linears = [module for module in model.modules() if isinstance(module, Linear) and module.packable()]
    if not linears:
        return 0
    arena = WeightArena(WeightArena.bytes_for([(linear.panel_shape(), linear.weight.dtype) for linear in linears]))
    return sum(linear.pack_weights(arena) for linear in linears)


class DenseLinear(nn.Linear):
    """A linear whose weight other code reads as a matrix (MLA's absorbed decode reads kv_b_proj's): it stays a dense
    float tensor, never packed, and a quantized checkpoint's weight for it loads dequantized."""

