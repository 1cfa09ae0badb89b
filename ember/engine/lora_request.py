"""What a request asks of adapters (`LoRARequest`, vLLM's spelling) and how many the engine serves (`LoRAConfig`).

Plain values, no torch: the API side builds them; the engine's adapter pool (ember.engine.lora) reads the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.engine.rejection import RequestRejected

LORA_DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class LoRARequest:
    """An adapter a request runs with (vLLM's LoRARequest): a name, an integer id unique per adapter, its folder.

    The id is what the engine keys slots and prefix-cache blocks by: two requests with one id share an adapter."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise RequestRejected("lora_request.lora_name must be a non-empty string", "lora_request")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise RequestRejected("lora_request.lora_int_id must be an integer of at least 1 (vLLM's rule)", "lora_request")

    @property
    def cache_key(self) -> tuple[str, int]:
        """The prefix-cache extra key: blocks computed under one adapter are never reused under another."""
        return ("lora", self.lora_int_id)


@dataclass(frozen=True)
class LoRAConfig:
    """Adapter serving: `max_loras` adapters in one step (the slots), ranks up to `max_lora_rank`, and up to
    `max_cpu_loras` read adapters kept in memory (None: as many as `max_loras`).

    `lora_dtype` (vLLM's name): what the adapters' matrices are held in. "auto": float32 beside float32 weights
    (exact: peft's products), the weights' own dtype beside bfloat16 / float16 ones, bfloat16 beside quantized ones
    (a 4-bit or int8 base rounds far coarser than bfloat16 rounds an adapter, and a decode step of many adapters
    reads half the bytes)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        if self.max_lora_rank < 1:
            raise ValueError("max_lora_rank must be at least 1")
        if self.lora_dtype not in LORA_DTYPES:
            raise ValueError(f"lora_dtype {self.lora_dtype!r} is not supported; choose one of {', '.join(LORA_DTYPES)}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")

    @property
    def num_cpu_adapters(self) -> int:
        return self.max_cpu_loras or self.max_loras
