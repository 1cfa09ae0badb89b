"""`ember bench structured` on the SmolLM2 GGUF at its smallest size: every variant at batch 1 and the batched ones at
batch 2, same run, replies checked (JSON against the schema, grammar replies against the grammar's language)."""

from __future__ import annotations

import pytest

from ember.bench.structured import (
    VARIANTS,
    bench_structured,
    format_structured_section,
    variants_at,
)
from ember.bench.suite import BenchOptions


@pytest.mark.timeout(1800)  # 15 engines, each built and run once
def test_every_finished_constrained_reply_conforms_and_each_variant_is_timed(smollm2_gguf):
    options = BenchOptions(model=str(smollm2_gguf), dtypes=("auto",), repeats=1, peers=())
    section = bench_structured(options, num_prompts=2, output_len=96, batch_sizes=(1, 2))
    assert list(section["batches"]) == ["1", "2"]
    assert list(section["batches"]["1"]["variants"]) == list(VARIANTS)
    assert list(section["batches"]["2"]["variants"]) == list(variants_at(2)) != list(VARIANTS)
    for batch in section["batches"].values():
        variants = batch["variants"]
        for name, entry in variants.items():
            if name == "free text":
                assert entry["output_tokens"] == 96  # free text runs to the limit (EOS ignored)
                continue
            finished, total = entry["finished"]
            assert total == 2 and finished >= 1, (name, entry)
            assert entry["valid"] == finished, name
            assert entry["decode_ratio"] > 0
    table = format_structured_section(section)
    assert table.count("| grammar, llguidance |") == 2 and "batch 2 (2 prompts):" in table
