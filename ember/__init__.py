"""ember: LLM inference and serving on the hardware you have.

`from ember import LLM, SamplingParams` (and `LoRARequest` for adapters) is the offline entry point; `ember serve` the server.
The names are imported on first use, so `import ember.tokenizers` never pulls in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

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
