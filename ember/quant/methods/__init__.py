"""Quantization methods for float checkpoints: calibration statistics, GPTQ, AWQ, SmoothQuant and its alpha search."""
