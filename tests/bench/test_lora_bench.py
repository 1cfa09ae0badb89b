"""`lora` measured for real through `ember bench all` (`run_all`) at a small size on the SmolLM2 GGUF: every variant
runs, the section and its goal row reach the report, and the random adapters are written to a folder that is gone after.

Slow (each of five variants is a fresh engine over 16 requests, and 16 random adapters are written and read);
run with `pytest -m slow tests/bench/test_lora_bench.py`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ember.bench.feature_benches import FeatureSizes
from ember.bench.lora import variants
from ember.bench.run_all import run_all
from ember.bench.suite import BenchOptions


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a few minutes on a quiet machine; ten times that on one shared by many jobs
def test_the_lora_section_runs_through_bench_all_and_reaches_the_report(smollm2_gguf, tmp_path):
    options = BenchOptions(model=str(smollm2_gguf), repeats=1, peers=())
    report_path = tmp_path / "BENCHMARKS.md"
    leftovers_before = set(Path(tempfile.gettempdir()).glob("ember-bench-lora-*"))
    results = run_all(options, "ember bench all --only lora", report_path, tmp_path / "out", only=("lora",), profile=False,
                      feature_sizes=FeatureSizes(lora_requests=16, lora_max_prompt=32, lora_max_output=16, lora_ranks=(8,)))
    assert results["errors"] == {}
    section = results["lora"]
    assert list(section["variants"]) == ["base model", "0 adapters, rank 8", "1 adapters, rank 8", "4 adapters, rank 8",
                                         "16 adapters, rank 8"] == list(variants((8,)))
    assert (section["dtype"], section["adapter_dtype"]) == ("auto", "bfloat16")  # the 4-bit base: QLoRA serving
    assert section["variants"]["base model"]["over_base"] == 1.0
    assert all(entry["output_tok_s"]["median"] > 0 for entry in section["variants"].values())
    assert section["sizes"]["used"] == {"requests": 16, "max_prompt": 32, "max_output": 16, "ranks": (8,)}
    assert set(Path(tempfile.gettempdir()).glob("ember-bench-lora-*")) == leftovers_before
    text = report_path.read_text()
    assert "## `lora`: multi-LoRA serving" in text and "| 16 adapters, rank 8 |" in text
    goals = text[text.index("## Goals"):]
    assert "| 50 | `lora` 16 distinct rank-8 adapters: `mixed` output tok/s over the base model | >= 0.8x |" in goals
