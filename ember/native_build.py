"""Builds small C sources into shared libraries on first use, cached by source digest.

Used for optional compiled fast paths (the tokenizer merge loop, the CPU GEMM and attention). Each caller
keeps a pure-Python/torch path as reference and fallback: no compiler, a failed build, or the
caller's opt-out environment variable all mean "not available" (None), never an error.
`load_cpu_kernels` is the one entry for the CPU kernels (GEMM, attention, elementwise ops): built
with -march=native and OpenMP, and refused as a whole by EMBER_PURE_TORCH=1.
The cache folder is $EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember.
A library built with -march=native is cached per CPU as well (model name and feature flags in
its digest): a cache folder shared between machines never hands one CPU another's instructions.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    explicit = os.environ.get("EMBER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ember"


def cpu_fingerprint() -> str:
    """The CPU's model name and feature flags (Linux /proc/cpuinfo); empty where unreadable."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    wanted = ("model name", "flags", "Features", "CPU part")  # x86 and ARM spellings
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def build_shared_library(name: str, source: str, flags: tuple[str, ...] = ("-O2",)) -> Path | None:
    """Path of `source` compiled with `flags` into a shared library; None when it cannot be built."""
    key = source + " ".join(flags)
    if any(flag.startswith(("-march=native", "-mcpu=native")) for flag in flags):
        key += cpu_fingerprint()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    try:
        target = cache_dir() / f"{name}_{digest}.so"
    except RuntimeError:  # no home folder to cache in
        return None
    if target.is_file():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            source_path = Path(scratch) / f"{name}.c"
            source_path.write_text(source)
            built = Path(scratch) / target.name
            subprocess.run(
                [compiler, *flags, "-shared", "-fPIC", "-o", str(built), str(source_path)],
                check=True,
                capture_output=True,
                timeout=120,
            )
            os.replace(built, target)  # atomic: concurrent builders never see half a file
    except (OSError, subprocess.SubprocessError):
        return None
    return target


PURE_TORCH_ENV = "EMBER_PURE_TORCH"  # set: every compiled CPU kernel is off, torch runs the model
CPU_KERNEL_FLAGS = ("-O3", "-march=native", "-fopenmp")
# For kernels whose result must not depend on the compiler fusing a multiply and an add (exact references).
EXACT_CPU_KERNEL_FLAGS = (*CPU_KERNEL_FLAGS, "-ffp-contract=off")


LOCAL_INCLUDE = re.compile(r'^#include "([\w./]+)"[ \t]*$', re.MULTILINE)


def with_local_includes(source_path: Path) -> str:
    """`source_path`'s text with each `#include "path.h"` replaced by that file's (a path relative to
    `source_path`'s folder), the included files' own local includes spliced in the same way.

    The source is compiled from a scratch copy and cached by its text, so a shared header must be
    part of that text: the cache then rebuilds when the header changes too."""
    folder = source_path.parent
    return LOCAL_INCLUDE.sub(lambda match: with_local_includes(folder / match.group(1)), source_path.read_text())


def load_cpu_kernels(name: str, source_path: Path, flags: tuple[str, ...] = CPU_KERNEL_FLAGS) -> ctypes.CDLL | None:
    """The CPU kernel library built from `source_path` with `flags`, loaded; None when off or unavailable."""
    if os.environ.get(PURE_TORCH_ENV):
        return None
    path = build_shared_library(name, with_local_includes(source_path), flags)
    if path is None:
        return None
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        return None
