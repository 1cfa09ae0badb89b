"""Where the engine runs: the device (cpu, cuda or auto), how much GPU memory the KV cache may fill, CUDA graphs.

The device is a property of the engine config that flows down as tensors' devices: the builder loads the weights,
allocates the KV cache and the sampler's stream there, and the runner builds each step's inputs there; layers pick
their kernels from the tensors they are handed (ember.layers.triton_kernels.kernels_for). torch is imported only
when a device is resolved, so building parsers (`ember --help`) stays light.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class DeviceConfig:
    """The engine's device and its GPU-only settings (ignored on a CPU).

    `device` "auto" is cuda when torch sees a CUDA device, else cpu; "cuda" without one is refused here, at
    config time, with what to do instead. On CUDA: `gpu_memory_utilization` is the share of the GPU's total
    memory the engine may hold once the KV cache is allocated (the weights, the activations' peak and the
    cache together, as vLLM's flag means it); `enforce_eager` runs every step eagerly instead of replaying
    the decode steps' captured CUDA graphs.
    """

    device: str = "auto"
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not supported; choose one of {', '.join(DEVICES)} (--device)")
        if isinstance(self.gpu_memory_utilization, bool) or not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be above 0 and at most 1 (--gpu-memory-utilization), "
                             f"not {self.gpu_memory_utilization!r}")
        if self.device == "cuda":
            refuse_absent_cuda()

    def resolved(self) -> torch.device:
        """The torch device the engine runs on ("auto" decided now)."""
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def load_dtype(self, dtype: str, device: torch.device) -> str:
        """The load dtype on `device`: "auto" is bfloat16 on CUDA (ember has no quantized CUDA kernels yet, so a
        quantized checkpoint's blocks are dequantized to it at load), as it is on a CPU everywhere else."""
        return "bfloat16" if dtype == "auto" and device.type == "cuda" else dtype


def refuse_absent_cuda() -> None:
    """Raise, saying what to do, when CUDA is asked for and torch sees no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"device 'cuda' was asked for, but torch {torch.__version__} ({built}) sees no CUDA device; "
                         "run with --device cpu (or auto, which picks cuda only where there is one)")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --gpu-memory-utilization and --enforce-eager, for every command that builds an engine."""
    defaults = DeviceConfig()
    parser.add_argument("--device", default=defaults.device, choices=DEVICES,
                        help="where the engine runs: auto (default) is cuda when torch sees a CUDA device, else cpu")
    # None when not given, so a CPU engine can say the flag changed nothing (ember.server.cli.vllm_notes).
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help=f"CUDA: share of the GPU's memory the engine may fill, the KV cache sized to it (default "
                             f"{defaults.gpu_memory_utilization}; a CPU engine sizes its cache with --kv-cache-memory or "
                             "--num-kv-blocks)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="CUDA: run decode steps eagerly instead of replaying captured CUDA graphs")


def device_from_args(args: argparse.Namespace) -> DeviceConfig:
    """The DeviceConfig `add_device_arguments`' flags describe."""
    utilization = args.gpu_memory_utilization
    return DeviceConfig(args.device, DeviceConfig.gpu_memory_utilization if utilization is None else utilization,
                        args.enforce_eager)
