"""Quantized weights: GGML block formats executed in place, and quantization methods for float checkpoints.

Quantization lives in the layer objects, picked at load: model files never branch on it.
"""
