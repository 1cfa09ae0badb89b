"""The vLLM side of the vLLM bench peer: a script run by the vLLM environment's own Python, as `python -P` (its own
folder, ember/bench, must not come first on sys.path: ember.bench.profile would hide the standard library's).

vLLM's CPU build pins other versions of transformers and setuptools than ember's, so it lives in its own
virtual environment (`make vllm-env`) and ember talks to it through this file, which imports nothing of ember
(ember is not installed there) and only the standard library until it loads vLLM.

Protocol: one JSON object per line on stdin, one JSON reply per line on the protocol stream (the process's
original stdout; everything vLLM prints is sent to stderr). Every reply has "ok"; a failed one has "error".

    {"op": "load", "model": FOLDER, "dtype": "bfloat16", "seed": 0}
        -> {"ok": true, "load_s": 131.2, "settings": {...}}
    {"op": "run", "mode": "offline" | "stream", "requests": [{"request_id": "r0", "prompt_token_ids": [...], "max_tokens": 8}]}
        -> {"ok": true, "wall_s": 3.1,
            "requests": [{"request_id": "r0", "output_tokens": 8, "output_token_ids": [...], "token_times_s": [...]}]}
    {"op": "quit"} -> {"ok": true}, and the process exits (as it does at the end of stdin)

Every request is greedy, with `ignore_eos`, so it makes exactly `max_tokens` tokens. The prefix cache is reset
before each run, so a repeat cannot be served its prompts from the previous repeat's cache.
- mode "offline": all requests through one `LLM.generate` call, as a user of vLLM's offline API runs a batch;
  `wall_s` is that call's wall time, and `token_times_s` is empty (generate returns only finished requests).
- mode "stream": the requests through vLLM's engine step loop (what `LLM.generate` runs), with outputs asked as
  deltas, so each delta's arrival is timed: `token_times_s` holds, per delta that carried tokens, the seconds
  since the run's start at which it came back. The batch1 bench's decode rate is read from them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

OPS = ("load", "run", "quit")
MODES = ("offline", "stream")


def parse_command(line: str) -> dict:
    """One protocol line as a command, checked: its op is known and a run's requests are well formed."""
    command = json.loads(line)
    if not isinstance(command, dict) or command.get("op") not in OPS:
        raise ValueError(f"a command is a JSON object whose op is one of {', '.join(OPS)}, not {line.strip()[:80]!r}")
    if command["op"] == "load" and not command.get("model"):
        raise ValueError("a load command names its model folder")
    if command["op"] == "run":
        if command.get("mode") not in MODES:
            raise ValueError(f"a run command's mode is one of {', '.join(MODES)}, not {command.get('mode')!r}")
        for request in command.get("requests") or []:
            if not request.get("prompt_token_ids") or int(request.get("max_tokens", 0)) < 1:
                raise ValueError(f"request {request.get('request_id')!r} needs prompt_token_ids and a max_tokens of at least 1")
    return command


def encode_reply(reply: dict) -> str:
    """One reply as its protocol line."""
    return json.dumps(reply, separators=(",", ":")) + "\n"


class Worker:
    """One vLLM `LLM`, loaded on the first load command and kept for every run after it."""

    def __init__(self) -> None:
        self.llm = None

    def handle(self, command: dict) -> dict:
        if command["op"] == "load":
            return self.load(command)
        if command["op"] == "run":
            return self.run(command["mode"], command["requests"])
        return {"ok": True}

    def load(self, command: dict) -> dict:
        """Load the model folder at `dtype` with vLLM's defaults otherwise, and warm it up with one short request."""
        from vllm import LLM

        started = time.monotonic()
        self.llm = LLM(model=command["model"], dtype=command.get("dtype", "auto"), seed=command.get("seed", 0))
        self.run("offline", [{"request_id": "warmup", "prompt_token_ids": [7] * 16, "max_tokens": 4}])
        return {"ok": True, "load_s": time.monotonic() - started, "settings": self.settings()}

    def settings(self) -> dict:
        """How this vLLM runs, read back from its config (for the bench report's peer settings)."""
        import vllm

        config = self.llm.llm_engine.vllm_config
        scheduler, cache = config.scheduler_config, config.cache_config
        return {
            "vllm_version": vllm.__version__,
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "chunked_prefill": scheduler.enable_chunked_prefill,
            "prefix_caching": cache.enable_prefix_caching,
            "block_size": cache.block_size,
            "compilation_mode": str(config.compilation_config.mode),
            **{name: os.environ.get(name, "") for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD")},
        }

    def run(self, mode: str, requests: list[dict]) -> dict:
        if self.llm is None:
            raise ValueError("a run command came before the load command")
        self.llm.reset_prefix_cache()
        run = self._offline if mode == "offline" else self._stream
        return {"ok": True, **run(requests)}

    def _offline(self, requests: list[dict]) -> dict:
        params = [_sampling_params(r["max_tokens"]) for r in requests]
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        started = time.monotonic()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        wall_s = time.monotonic() - started
        done = [{"request_id": r["request_id"], "output_tokens": len(o.outputs[0].token_ids), "output_token_ids": list(o.outputs[0].token_ids),
                 "token_times_s": []} for r, o in zip(requests, outputs, strict=True)]
        return {"wall_s": wall_s, "requests": done}

    def _stream(self, requests: list[dict]) -> dict:
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        times: dict[str, list[float]] = {r["request_id"]: [] for r in requests}
        tokens: dict[str, list[int]] = {r["request_id"]: [] for r in requests}
        started = time.monotonic()
        for r in requests:
            params = _sampling_params(r["max_tokens"], output_kind=RequestOutputKind.DELTA)
            engine.add_request(r["request_id"], {"prompt_token_ids": r["prompt_token_ids"]}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                now = time.monotonic() - started
                if output.outputs[0].token_ids:
                    times[output.request_id].append(now)
                    tokens[output.request_id].extend(output.outputs[0].token_ids)
        wall_s = time.monotonic() - started
        done = [{"request_id": rid, "output_tokens": len(tokens[rid]), "output_token_ids": tokens[rid], "token_times_s": token_times}
                for rid, token_times in times.items()]
        return {"wall_s": wall_s, "requests": done}


def _sampling_params(max_tokens: int, **extra):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


def protocol_stream():
    """The process's stdout as the protocol's own stream, with file descriptor 1 pointed at stderr from here on,
    so that nothing vLLM or its libraries print can land between two replies."""
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def serve(commands, replies) -> None:
    """Answer each command line from `commands` on `replies`, until quit or the end of `commands`."""
    worker = Worker()
    for line in commands:
        if not line.strip():
            continue
        try:
            command = parse_command(line)
            reply = worker.handle(command)
        except Exception as error:  # every failure goes back to ember as a reply; the worker keeps serving
            command, reply = {}, {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        replies.write(encode_reply(reply))
        if command.get("op") == "quit":
            return


if __name__ == "__main__":
    serve(sys.stdin, protocol_stream())
