"""Tiny AutoGPTQ / AutoAWQ checkpoints written from the format descriptions with numpy bit operations.

Independent of ember's reader: codes, zero points and scales are chosen here (min/max per group, as the
GPTQ quantizer does), packed by the layouts' rules, and the float weights they stand for are computed
from those integers, not from the packed words:

- GPTQ: qweight int32 [in * bits / 32, out], input index 32/bits * r + k in bits [bits*k, bits*(k+1)) of
  row r; qzeros int32 [groups, out * bits / 32] packed alike along the output index, holding z - 1 in the
  v1 format ("gptq") and z in "gptq_v2"; scales float16 [groups, out]; g_idx int32 [in].
- AWQ GEMM: qweight int32 [in, out / 8], output column 8c + AWQ_ORDER[k] in bits [4k, 4k+4) of word c;
  qzeros alike over [groups, out]; scales float16 [groups, out].
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

# The decoder's linears by their last name, as AutoGPTQ / AutoAWQ quantize them: attention (MLA's too), MLPs and each
# expert's (Mixtral's w1/w2/w3); norms, embeddings and routers stay float.
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "kv_a_proj_with_mqa", "kv_b_proj",
           "w1", "w2", "w3")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


@dataclass(frozen=True)
class Variant:
    """One checkpoint layout: method, bits, group size (-1: whole rows), symmetric, act-order, GPTQ format."""

    method: str = "gptq"
    bits: int = 4
    group_size: int = 32
    sym: bool = False
    act_order: bool = False
    checkpoint_format: str = "gptq"
    shared_order: bool = True  # act-order: linears reading one input share its column order (as GPTQ's Hessians do)

    def quantization_config(self) -> dict:
        if self.method == "awq":
            return {"quant_method": "awq", "bits": self.bits, "group_size": self.group_size, "zero_point": True, "version": "gemm"}
        return {"quant_method": "gptq", "bits": self.bits, "group_size": self.group_size, "desc_act": self.act_order,
                "sym": self.sym, "true_sequential": True, "checkpoint_format": self.checkpoint_format, "damp_percent": 0.01}


@dataclass
class Quantized:
    """One linear: codes [out, in], zero points and scales [groups, out], g_idx [in]; `values` the float weight."""

    codes: np.ndarray
    zeros: np.ndarray
    scales: np.ndarray
    g_idx: np.ndarray

    @property
    def values(self) -> np.ndarray:
        scale = self.scales.astype(np.float64)[self.g_idx].T
        return (scale * (self.codes.astype(np.int64) - self.zeros[self.g_idx].T)).astype(np.float32)


def quantize(weight: np.ndarray, variant: Variant, order: np.ndarray) -> Quantized:
    """Min/max group quantization; groups of `group_size` columns taken in `order` (act-order: a Hessian's)."""
    rows, cols = weight.shape
    group_size = variant.group_size if variant.group_size > 0 else cols
    g_idx = np.empty(cols, dtype=np.int32)
    g_idx[order] = np.arange(cols) // group_size
    maxq = (1 << variant.bits) - 1
    lowest_zero = 1 if variant.method == "gptq" and variant.checkpoint_format == "gptq" else 0  # v1 cannot store z = 0
    groups = int(g_idx.max()) + 1
    codes = np.zeros((rows, cols), dtype=np.int64)
    zeros = np.zeros((groups, rows), dtype=np.int64)
    scales = np.zeros((groups, rows), dtype=np.float16)
    for group in range(groups):
        columns = np.nonzero(g_idx == group)[0]
        w = weight[:, columns].astype(np.float64)
        low, high = np.minimum(w.min(axis=1), 0), np.maximum(w.max(axis=1), 0)
        if variant.sym:
            high = np.maximum(-low, high)
            low = -high
        scale = ((high - low) / maxq).astype(np.float16)
        scale[scale == 0] = 1
        zero = np.full(rows, (maxq + 1) // 2) if variant.sym else np.clip(np.round(-low / scale), lowest_zero, maxq).astype(np.int64)
        codes[:, columns] = np.clip(np.round(w / scale.astype(np.float64)[:, None]) + zero[:, None], 0, maxq)
        zeros[group], scales[group] = zero, scale
    return Quantized(codes, zeros, scales, g_idx)


def pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """uint values [n, m] -> int32 [n * bits / 32, m]: 32/bits consecutive rows per word, the first lowest."""
    per_word = 32 // bits
    grouped = values.astype(np.uint32).reshape(values.shape[0] // per_word, per_word, values.shape[1])
    words = np.zeros((grouped.shape[0], values.shape[1]), dtype=np.uint32)
    for k in range(per_word):
        words |= grouped[:, k, :] << np.uint32(bits * k)
    return words.view(np.int32)


def pack_awq_columns(values: np.ndarray) -> np.ndarray:
    """uint4 values [n, m] -> int32 [n, m / 8]: word c holds column 8c + AWQ_ORDER[k] at position k."""
    interleaved = values.astype(np.uint32).reshape(values.shape[0], -1, 8)[:, :, AWQ_ORDER]
    words = np.zeros(interleaved.shape[:2], dtype=np.uint32)
    for k in range(8):
        words |= interleaved[:, :, k] << np.uint32(4 * k)
    return words.view(np.int32)


def packed_tensors(q: Quantized, variant: Variant) -> dict[str, np.ndarray]:
    """The checkpoint tensors of one linear in the variant's layout."""
    if variant.method == "awq":
        return {"qweight": pack_awq_columns(q.codes.T), "qzeros": pack_awq_columns(q.zeros), "scales": q.scales}
    mask = (1 << variant.bits) - 1
    stored_zeros = (q.zeros - (1 if variant.checkpoint_format == "gptq" else 0)) & mask
    return {"qweight": pack_rows(q.codes.T, variant.bits), "qzeros": np.ascontiguousarray(pack_rows(stored_zeros.T, variant.bits).T),
            "scales": q.scales, "g_idx": q.g_idx}


def write_checkpoint(source: Path, target: Path, variant: Variant, seed: int = 0) -> dict[str, torch.Tensor]:
    """`source` (a float HF folder) quantized into `target` in the variant's layout, other tensors float16.

    Returns the float32 state dict the checkpoint stands for (dequantized linears, float16-rounded rest)."""
    rng = np.random.default_rng(seed)
    state = load_file(str(source / "model.safetensors"))
    tensors, reference, orders = {}, {}, {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and ".layers." in name and module.rpartition(".")[2] in LINEARS:
            cols = tensor.shape[1]
            key = (module.rpartition(".")[0], cols) if variant.shared_order else module  # q/k/v, gate/up share an input
            if key not in orders:
                orders[key] = rng.permutation(cols) if variant.act_order else np.arange(cols)
            q = quantize(tensor.float().numpy(), variant, orders[key])
            tensors.update({f"{module}.{part}": torch.from_numpy(np.ascontiguousarray(v)) for part, v in packed_tensors(q, variant).items()})
            reference[name] = torch.from_numpy(q.values)
        else:
            tensors[name] = tensor.to(torch.float16)
            reference[name] = tensors[name].float()
    target.mkdir(parents=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = variant.quantization_config()
    (target / "config.json").write_text(json.dumps(config))
    for extra in ("generation_config.json",):
        if (source / extra).is_file():
            shutil.copy2(source / extra, target / extra)
    return reference
