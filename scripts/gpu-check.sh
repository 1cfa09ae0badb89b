#!/usr/bin/env bash
# The one prepared GPU run (issue 47): the CUDA tests and the Triton kernels' parity tests compiled on the GPU,
# a kernel benchmark against torch on the same tensors, then the engine against HF transformers on random-weight
# models of SmolLM2-135M's and Qwen2.5-1.5B's shapes (batch-1 decode, batch 64, mixed; greedy GPU vs CPU parity;
# bf16 logits vs transformers), as tables on stdout and in $OUT/gpu-check.txt when OUT is set.
#
# Runs from a plain checkout on a CUDA machine whose image has torch, triton, transformers, safetensors, numpy,
# regex, jinja2, rich, httpx, prometheus-client (no fastapi, uvicorn, gguf: nothing it imports needs them) and no
# network. pytest and gguf (the engine's GGUF reader imports it) are used when importable; otherwise they are
# unpacked, offline, from .gpu-wheels/ (made here by `make gpu-wheels`, an ignored folder: carry it with the tree).
# Without CUDA it stops within seconds, saying so.
#
# Estimated runtime on an H100 / H200 (not yet measured: no GPU was lent when it was written): 10-20 s to import
# torch and check the device; about 60-120 s of tests, most of it compiling some 30 kernel specializations
# (1-3 s each); about 15 s of kernel benchmark (12 cases, 20 timed calls each). The engine section, per shape:
# 5-15 s to build and save the random checkpoint (3 GB for the 1.5B shape), 3 engines each loading (cached
# weights) and capturing decode graphs (~10-20 s, Triton compiles included, the first time), HF batch-1 decode of
# 128 tokens at ~17 tok/s (~8 s), HF batch 64 x 128 and mixed (~20-30 s), parity (4 engines, CPU float32 of the
# 1.5B shape the slowest, ~20-40 s on 16 cores). About 2-3 minutes per shape: 6-8 minutes in all. Run it with a
# 600 s limit; --shapes smollm2-135m alone halves the engine section.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
unset TRITON_INTERPRET  # the kernels must compile for the GPU, not run in the interpreter

# No NVIDIA device node and no driver tool: no GPU, said before torch takes seconds to import.
if [ ! -e /dev/nvidiactl ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA driver here (no /dev/nvidiactl, no nvidia-smi). This check needs a CUDA GPU;" \
       "on a CPU, 'make test' runs the Triton kernels' parity tests in interpreter mode." >&2
  exit 2
fi

"$PYTHON" - <<'PY' || exit 2
import sys
try:
    import torch
except ImportError:
    sys.exit("gpu-check: torch is not importable here; install torch (a CUDA build) or set PYTHON to the interpreter that has it")
if not torch.cuda.is_available():
    sys.exit(f"gpu-check: no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda}, sees none). "
             "This check needs a GPU; on a CPU, `make test` runs the Triton kernels' parity tests in interpreter mode.")
try:
    import triton
except ImportError:
    sys.exit("gpu-check: triton is not importable; install it (pip install triton, or pip install -e '.[gpu]')")
print(f"gpu-check: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
PY

if ! "$PYTHON" -c "import pytest, gguf" 2>/dev/null; then
  if [ ! -d .gpu-wheels ]; then
    echo "gpu-check: pytest or gguf is not installed and there is no .gpu-wheels/ folder to install them from offline;" \
         "run 'make gpu-wheels' on a machine with network and carry .gpu-wheels with the tree" >&2
    exit 2
  fi
  # Pure-Python wheels are zip files laid out as site-packages: unpacked, they import (no pip needed).
  site="$(mktemp -d)"
  for wheel in .gpu-wheels/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$site"; done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/gpu_check.py "$@"
