"""Weights as codes ember's GGML blocks hold: group-wise integer grids, grouped integer codes with zero points
(GPTQ, AWQ, compressed-tensors) and float codes (NF4, FP8)."""
