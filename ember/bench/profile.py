"""Where ember's time goes: torch.profiler over decode steps of a batch, by operator."""

from __future__ import annotations

import time


def profile_ember(model: str, dtype: str = "float32", batch: int = 16, prompt_len: int = 128, steps: int = 16, top: int = 8) -> dict:
    """Self CPU time by operator over `steps` decode steps of `batch` sequences, and the share outside torch ops."""
    from torch.profiler import ProfilerActivity, profile

    from ember.bench.ember_runner import EmberSettings, make_engine
    from ember.engine.engine_request import EngineRequest
    from ember.engine.sampling_params import SamplingParams

    engine = make_engine(model, dtype, EmberSettings())
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(EngineRequest(f"profile-{i}", [(13 * i + j) % 1000 + 100 for j in range(prompt_len)], params))
    for _ in range(3):  # prefill and a couple of decode steps before measuring
        engine.step()
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    wall_us = (time.perf_counter() - started) * 1e6
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_self = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "what": f"{steps} decode steps of {batch} sequences, {dtype}",
        "step_ms": wall_us / steps / 1000,
        "top": [{"name": e.key, "pct": 100.0 * e.self_cpu_time_total / total_self, "calls": e.count} for e in events[:top]],
        "python_overhead_pct": max(0.0, 100.0 * (1 - total_self / wall_us)),
    }
