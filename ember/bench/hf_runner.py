"""HF transformers as a user runs it: `generate()` on static batches with left padding.

The model loads from the same GGUF (`gguf_file=`, dequantized by transformers) or the same
safetensors folder as ember's. Greedy decoding; outputs are forced to the batch's longest target
(`min_new_tokens`), and only each request's own target counts as output, so tokens HF computes
past a request's end are the price of static batching, not a gift to its throughput.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import time
from dataclasses import dataclass
from pathlib import Path

from ember.bench.results import RequestTiming, RunResult
from ember.bench.workloads import Workload

TORCH_DTYPES = ("float32", "bfloat16")


# What HF transformers needs to load the models ember benchmarks: a GGUF file also takes accelerate and gguf
# (without accelerate, loading fails partway through a bench section instead of leaving the peer out).
HF_MODULES = ("transformers", "accelerate", "gguf")


def hf_available() -> str | None:
    """None if transformers can load the bench's models here, else why not."""
    missing = first_missing(HF_MODULES)
    if missing is not None:
        return f"{missing} is not installed (the HF transformers peer loads GGUF files with {', '.join(HF_MODULES)}: pip install {missing})"
    return None


def first_missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` Python cannot import here, or None."""
    return next((name for name in modules if importlib.util.find_spec(name) is None), None)


@dataclass
class PaddedWork:
    """Tokens a static, left-padded batch computes against those its requests asked for.

    A batch's prompts are padded to its longest prompt, and every row generates the batch's
    longest target: the extra rows and columns are computed (and cost time) but are nobody's output.
    """

    prompt_tokens: int = 0
    prompt_tokens_incl_padding: int = 0
    output_tokens: int = 0
    generated_tokens_incl_padding: int = 0

    def add_batch(self, prompt_lens: list[int], targets: list[int], output_width: int) -> None:
        """One batch: its prompt lengths, output targets, and the width of what generate() returned."""
        self.prompt_tokens += sum(prompt_lens)
        self.prompt_tokens_incl_padding += max(prompt_lens) * len(prompt_lens)
        self.output_tokens += sum(targets)
        self.generated_tokens_incl_padding += (output_width - max(prompt_lens)) * len(prompt_lens)

    def to_dict(self) -> dict:
        def waste(useful: int, computed: int) -> float:
            return 100.0 * (computed - useful) / computed if computed else 0.0

        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_incl_padding": self.prompt_tokens_incl_padding,
            "generated_tokens_incl_padding": self.generated_tokens_incl_padding,
            "output_padding_waste_pct": waste(self.output_tokens, self.generated_tokens_incl_padding),
            "prompt_padding_waste_pct": waste(self.prompt_tokens, self.prompt_tokens_incl_padding),
        }


class HFRunner:
    """One loaded transformers model; `run` times one pass of a workload through it."""

    def __init__(self, model_path: Path, dtype: str, batch_size: int = 16, device: str = "cpu") -> None:
        """`device`: where the model and every batch's inputs live (scripts/gpu_check.py runs it on "cuda")."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # the benchmark's own progress bar is the one to watch
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"HF peer dtype must be one of {TORCH_DTYPES}")
        torch_dtype = getattr(torch, dtype)
        # transformers' GGUF conversion draws its own tqdm bar whatever the verbosity.
        with contextlib.redirect_stderr(io.StringIO()):
            if model_path.is_file():
                model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name, dtype=torch_dtype)
            else:
                model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch_dtype)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.dtype = dtype
        self.batch_size = batch_size
        self.pad_id = 0
        self._generate([[1] * 8], 2)  # warm-up

    def _generate(self, prompts: list[list[int]], max_new_tokens: int):
        import torch

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        with torch.inference_mode():
            return self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.pad_id,
            )

    def settings(self, batch_size: int) -> dict:
        """How this peer runs, for the report: attention kernel, KV cache, batching, threads."""
        import torch

        cache = getattr(self.model.generation_config, "cache_implementation", None)
        return {
            "attention_implementation": getattr(self.model.config, "_attn_implementation", None),
            "kv_cache": cache or "dynamic (transformers' default DynamicCache)",
            "batching": f"static batches of {batch_size}, prompts left-padded, outputs forced to the batch's longest target",
            "torch_threads": torch.get_num_threads(),
            "dtype": self.dtype,
        }

    def run(self, workload: Workload, batch_size: int | None = None) -> RunResult:
        size = batch_size or self.batch_size
        timings = []
        work = PaddedWork()
        started = time.monotonic()
        for start in range(0, len(workload.requests), size):
            batch = workload.requests[start : start + size]
            longest = max(r.max_tokens for r in batch)
            output = self._generate([r.prompt_token_ids for r in batch], longest)
            now = time.monotonic()
            work.add_batch([r.prompt_len for r in batch], [r.max_tokens for r in batch], output.shape[1])
            for r in batch:
                timings.append(RequestTiming(r.request_id, r.role, r.prompt_len, r.max_tokens, started, finished=now))
        wall_s = time.monotonic() - started
        useful = sum(t.output_tokens for t in timings)
        extra = {"dtype": self.dtype, "batch_size": size, "settings": self.settings(size), **work.to_dict()}
        return RunResult("hf", workload.name, wall_s, useful, timings, extra)

    def run_batch1(self, workload: Workload) -> RunResult:
        """Each request alone (batch 1), with a streamer timing every generated token."""
        import torch
        from transformers.generation.streamers import BaseStreamer

        class TokenClock(BaseStreamer):
            def __init__(self) -> None:
                self.calls: list[float] = []

            def put(self, value) -> None:
                self.calls.append(time.monotonic())

            def end(self) -> None:
                pass

        timings = []
        started = time.monotonic()
        for r in workload.requests:
            clock = TokenClock()
            arrival = time.monotonic()
            with torch.inference_mode():
                self.model.generate(
                    input_ids=torch.tensor([r.prompt_token_ids], device=self.device),
                    attention_mask=torch.ones((1, r.prompt_len), dtype=torch.long, device=self.device),
                    max_new_tokens=r.max_tokens,
                    min_new_tokens=r.max_tokens,
                    do_sample=False,
                    pad_token_id=self.pad_id,
                    streamer=clock,
                )
            token_times = clock.calls[1:]  # the first put() is the prompt
            timings.append(
                RequestTiming(r.request_id, r.role, r.prompt_len, len(token_times), arrival,
                              first_token=token_times[0], finished=token_times[-1], token_times=token_times)
            )
        wall_s = time.monotonic() - started
        extra = {"dtype": self.dtype, "batch_size": 1, "settings": self.settings(1)}
        return RunResult("hf", workload.name, wall_s, sum(t.output_tokens for t in timings), timings, extra)
