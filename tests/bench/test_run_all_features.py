"""spec, quant, parallel and structured measured for real through `run_all` at their smallest sizes on the SmolLM2 GGUF.

Slow (minutes on two shared cores: three benches load the model several times, quantize it and
start two tensor-parallel workers); run with `pytest -m slow tests/bench/test_run_all_features.py`.
"""

from __future__ import annotations

import json

import pytest

from ember.bench.feature_benches import FEATURE_SECTIONS, FeatureSizes
from ember.bench.run_all import run_all
from ember.bench.structured import VARIANTS
from ember.bench.suite import BenchOptions

TINY = FeatureSizes(spec_prompts=1, spec_output_len=8, spec_methods=("ngram", "draft"), spec_batch_sizes=(1, 2), spec_mixed_requests=2,
                    spec_mixed_max_output=8, quant_methods=("rtn4",), quant_eval_windows=1, quant_calib_tokens=256,
                    parallel_prompts=1, parallel_prompt_len=8, parallel_max_tokens=2, structured_prompts=1,
                    structured_output_len=8, structured_batch_sizes=(1,))  # fmt: skip


@pytest.mark.slow
def test_the_feature_sections_run_through_bench_all_and_reach_the_report(smollm2_gguf, tmp_path):
    options = BenchOptions(model=str(smollm2_gguf), repeats=1, peers=())
    report_path = tmp_path / "BENCHMARKS.md"
    results = run_all(options, "ember bench all --only spec,quant,parallel,structured", report_path, tmp_path / "out", only=FEATURE_SECTIONS,
                      profile=False, feature_sizes=TINY)  # fmt: skip
    assert results["errors"] == {}
    assert set(results["spec"]["batch1"]) == {"code-edit", "quote-summary", "free-story"}
    assert {"plain", "ngram", "draft"} <= set(results["spec"]["batch1"]["code-edit"])  # the 4-bit self-draft ran
    assert set(results["spec"]["batch_sweep"]) == {"1", "2"} and results["spec"]["mixed"]["num_requests"] == 2
    assert [row["name"] for row in results["quant"]["rows"]] == ["float32", "checkpoint as stored", "rtn4 g128"]
    assert set(results["parallel"]["modes"]) == {"tensor", "sequence", "pipeline", "tensor-quantized"} and results["parallel"]["errors"] == {}
    assert list(results["structured"]["batches"]["1"]["variants"]) == list(VARIANTS)
    saved = json.loads(next((tmp_path / "out" / "results").glob("2*.json")).read_text())
    assert saved["options"]["feature_sizes"]["quant_methods"] == ["rtn4"]
    text = report_path.read_text()
    for heading in ("## `spec`", "## `quant`", "## `parallel`", "## `structured`"):
        assert heading in text
    goals = text[text.index("## Goals"):text.index("## Not run") if "## Not run" in text else None]
    assert "| 11 | `spec` batch 1 greedy, code-edit: n-gram output tok/s over plain | >= 2x |" in goals
    assert "| 10 | `quant` every 4-bit method: perplexity over float32 (worst) |" in goals
    assert results["parallel"]["modes"]["tensor-quantized"]["dtype"] == "auto"
    for mode in ("tensor parallel", "tensor + sequence parallel", "pipeline parallel", "tensor parallel on the quantized weights (--dtype auto)"):
        assert f"`parallel` {mode} x2:" in goals
    assert "counted / formula | 1.00x (within 1%) | 1.00x" in goals
    for png in ("spec_acceptance.png", "quant.png", "parallel.png"):
        assert (tmp_path / "out" / "plots" / png).read_bytes()[:4] == b"\x89PNG"
