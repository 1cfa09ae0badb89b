"""The rows `ember bench quant` can run: each name's `ember quantize` method and bits (free of torch, so the
CLI and the report can list them)."""

from __future__ import annotations

METHOD_SPECS = {"rtn4": ("rtn", 4), "gptq4": ("gptq", 4), "awq4": ("awq", 4), "nf4": ("nf4", 4),
                "rtn8": ("rtn", 8), "gptq8": ("gptq", 8), "awq8": ("awq", 8), "fp8": ("fp8", 8),
                "sq8": ("smoothquant", 8)}
DEFAULT_METHODS = ("rtn4", "gptq4", "awq4", "nf4", "rtn8", "gptq8", "fp8", "sq8")
