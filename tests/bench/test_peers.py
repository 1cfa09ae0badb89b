"""HF transformers as a peer: its padding is counted, not hidden, and its settings are recorded.
Real transformers on a tiny random model; no timing is asserted."""

from __future__ import annotations

import pytest

from ember.bench.hf_runner import HFRunner, PaddedWork, first_missing
from tests.bench.test_levers import tiny_workload
from tests.model_factory import save_tiny_model


def test_padded_work_counts_the_rows_and_columns_nobody_asked_for():
    work = PaddedWork()
    work.add_batch(prompt_lens=[5, 8], targets=[4, 6], output_width=8 + 6)  # generate() returns prompt width + longest target
    assert work.to_dict() == {
        "prompt_tokens": 13,
        "prompt_tokens_incl_padding": 16,
        "generated_tokens_incl_padding": 12,
        "output_padding_waste_pct": pytest.approx(100 * 2 / 12),
        "prompt_padding_waste_pct": pytest.approx(100 * 3 / 16),
    }


def test_hf_reports_useful_and_computed_tokens_and_how_it_ran(tmp_path):
    runner = HFRunner(save_tiny_model("llama", tmp_path), "float32")
    workload = tiny_workload(3)  # targets 4, 6, 8; prompts 5, 8, 11 tokens
    result = runner.run(workload, batch_size=2)
    assert result.output_tokens == 4 + 6 + 8
    assert result.extra["generated_tokens_incl_padding"] == 2 * 6 + 1 * 8  # batch 1 pads to 6, batch 2 alone
    assert result.extra["prompt_tokens_incl_padding"] == 2 * 8 + 11
    settings = result.extra["settings"]
    assert settings["attention_implementation"] == runner.model.config._attn_implementation
    assert settings["kv_cache"] and "static batches of 2" in settings["batching"]


def test_a_peer_missing_one_of_its_modules_is_named():
    assert first_missing(("json", "ember_no_such_module", "also_missing")) == "ember_no_such_module"
    assert first_missing(("json", "torch")) is None
