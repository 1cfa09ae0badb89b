"""ember: LLM inference and serving on the hardware you have.

`from ember import LLM, SamplingParams` (and `LoRARequest` for adapters) is the offline entry point; `ember serve` the server.
The names are imported on first use, so `import ember.tokenizers` never pulls in torch.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that sleep, not spin, while they wait: a spinning thread steals the time slice of the
# thread it waits for when another process competes for the cores (ember.engine.threads measures it).
# Read once, when torch loads the OpenMP runtime, so it is set here, before any of ember imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_EXPORTS = {
    "LLM": "ember.llm",
    "SamplingParams": "ember.engine.sampling_params",
    "RequestOutput": "ember.engine.outputs",
    "CompletionOutput": "ember.engine.outputs",
    "LoRARequest": "ember.engine.lora_request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ember' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
