#!/usr/bin/env bash
# The one prepared GPU run (issue 47): the CUDA tests and the Triton kernels' parity tests compiled on the GPU,
# then a kernel benchmark against torch on the same tensors, as one table on stdout and in $OUT/gpu-check.txt
# when OUT is set.
#
# Runs from a plain checkout on a CUDA machine whose image has torch, triton, transformers, safetensors, numpy,
# regex, jinja2, rich, httpx, prometheus-client (no fastapi, uvicorn, gguf: nothing it imports needs them) and no
# network. pytest is used when importable; otherwise it is installed, offline, from .gpu-wheels/ (made here by
# `make gpu-wheels`, an ignored folder: carry it with the tree). Without CUDA it stops within seconds, saying so.
#
# Estimated runtime on an H100 / H200 (not yet measured: no GPU was lent when it was written): 10-20 s to import
# torch and check the device; about 60-120 s of tests, most of it compiling some 30 kernel specializations
# (1-3 s each); about 30 s of benchmark (12 cases, 50 timed calls each, milliseconds per call). Total 2-3 minutes,
# well within a 10-minute call.
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

if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
  if [ ! -d .gpu-wheels ]; then
    echo "gpu-check: pytest is not installed and there is no .gpu-wheels/ folder to install it from offline;" \
         "run 'make gpu-wheels' on a machine with network and carry .gpu-wheels with the tree" >&2
    exit 2
  fi
  # Pure-Python wheels are zip files laid out as site-packages: unpacked, they import (no pip needed).
  site="$(mktemp -d)"
  for wheel in .gpu-wheels/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$site"; done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/gpu_check.py "$@"
