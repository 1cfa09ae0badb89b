"""Where the numbers came from: CPU model and flags, threads, library versions, load, commit."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path

INTERESTING_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                     "avx512_bf16", "avx_vnni", "amx_bf16", "amx_tile", "amx_int8")


def cpu_info() -> dict:
    model, flags = platform.processor() or "unknown", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and model in ("unknown", "", platform.processor()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return {"cpu_model": model, "cpu_flags": [f for f in INTERESTING_FLAGS if f in flags]}


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - any failure means "not installed" here
        return None


def memory_gib() -> float | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    import torch

    info = cpu_info()
    info.update(
        {
            "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "memory_gib": memory_gib(),
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "llama_cpp_python": _version("llama_cpp_python"),
            "load_average_at_start": load_average(),
            "llama_cpp_system_info": llama_cpp_system_info(),
        }
    )
    return info


def llama_cpp_system_info() -> str | None:
    """llama.cpp's own line of the CPU features it was built with, where llama-cpp-python is installed."""
    try:
        import llama_cpp

        return llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    except Exception:  # noqa: BLE001 - not installed, or its library does not load
        return None


def git_commit(repo: Path | None = None) -> str:
    """The checked-out commit, with '+dirty.<hash of the diff>' when tracked files differ from it
    (so two runs of the same dirty tree say so, and a report names exactly what it measured),
    or 'unknown' outside a git checkout."""
    cwd = repo or Path(__file__).resolve().parents[2]
    try:
        commit = _git(cwd, "rev-parse", "--short=12", "HEAD").strip()
        diff = _git(cwd, "diff", "HEAD", "--binary")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if not diff:
        return commit
    return f"{commit}+dirty.{hashlib.sha256(diff.encode()).hexdigest()[:12]}"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout
