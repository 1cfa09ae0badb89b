"""`ember bench structured` on the SmolLM2 GGUF at its smallest size: three variants, same run, replies checked."""

from __future__ import annotations

from ember.bench.structured import VARIANTS, bench_structured, format_structured_section
from ember.bench.suite import BenchOptions


def test_every_finished_constrained_reply_conforms_and_each_variant_is_timed(smollm2_gguf):
    section = bench_structured(BenchOptions(model=str(smollm2_gguf), dtypes=("auto",), repeats=1, peers=()), num_prompts=2, output_len=96)
    variants = section["variants"]
    assert list(variants) == list(VARIANTS)
    for name in ("json_object", "json_schema", "json_schema, served before", "json_schema, served before, n-gram"):
        finished, total = variants[name]["finished"]
        assert total == 2 and finished >= 1
        assert variants[name]["valid"] == finished
        assert variants[name]["decode_ratio"] > 0
    assert variants["free text"]["output_tokens"] == 96  # free text runs to the limit (EOS ignored)
    table = format_structured_section(section)
    assert table.count("\n") == 6 and "| json_schema |" in table
