"""The spec, quant and parallel sections of `ember bench all`: sizes from --scale, tables, goal verdicts, re-rendering."""

from __future__ import annotations

import json

import pytest

from ember.bench import report
from ember.bench.feature_benches import FeatureSizes, planned_runs
from ember.bench.run_all import SECTIONS, rerender
from ember.bench.suite import BenchOptions
from tests.bench.test_report import fake_results


def _spread(median):
    return {"median": median, "min": median * 0.9, "max": median * 1.1, "values": [median]}


def _engine(tok_s, ratio=None, acceptance=0.0, histogram=(0, 0, 0, 0, 0)):
    entry = {"label": "ember", "tok_s": _spread(tok_s), "decode_tok_s": _spread(tok_s * 1.2), "acceptance_rate": acceptance,
             "mean_accepted_length": 1.0 + 3 * acceptance, "draft_time_s": 0.1, "verify_time_s": 0.5,
             "accepted_histogram": list(histogram), "num_steps": 100}
    if ratio is not None:
        entry.update(ratio=ratio, decode_ratio=ratio * 1.1)
    return entry


def spec_section() -> dict:
    def workload(ngram_ratio, draft_ratio, prompt_len):
        return {"plain": _engine(10.0), "ngram": _engine(10.0 * ngram_ratio, ngram_ratio, 0.7, (1, 1, 2, 3, 9)),
                "draft": _engine(10.0 * draft_ratio, draft_ratio, 0.95, (0, 0, 0, 1, 20)),
                "medusa": _engine(9.0, 0.9, 0.1, (20, 2, 0, 0, 0)), "prompt_len": prompt_len, "output_len": 128}

    return {
        "dtype": "float32", "num_speculative_tokens": 4, "draft_model": "/m/SmolLM2.gguf", "draft_dtype": "auto", "repeats": 3,
        "batch1": {"code-edit": workload(2.5, 1.3, [380, 402]), "quote-summary": workload(1.5, 1.1, [384]),
                   "free-story": workload(0.85, 0.95, [41])},
        "batch_sweep": {"1": {"plain": _engine(10.0), "ngram": _engine(25.0, 2.5, 0.7)},
                        "8": {"plain": _engine(60.0), "ngram": _engine(48.0, 0.8, 0.7)}},
        "crossover_batch": 8,
        "mixed": {"plain": _engine(60.0), "ngram": _engine(54.0, 0.9, 0.4), "num_requests": 8},
        "sizes": FeatureSizes.for_scale(0.25).record("spec_"),
    }


def quant_section() -> dict:
    def row(name, ppl, bytes_per_parameter, tok_s, quantize_s=0.0):
        return {"name": name, "perplexity": ppl, "bytes_per_parameter": bytes_per_parameter,
                "nominal_bytes_per_parameter": bytes_per_parameter * 0.9, "decode_tok_s": tok_s,
                "quantize_s": quantize_s, "ppl_vs_float_pct": 100.0 * (ppl / 20.0 - 1.0)}

    return {"model": "/m/SmolLM2.gguf", "calib": "/c/tinyshakespeare.txt", "eval": "/c/botchan.txt", "eval_tokens": 256,
            "calib_tokens": 512, "group_size": 128, "sizes": FeatureSizes.for_scale(0.25).record("quant_"),
            "rows": [row("float32", 20.0, 4.0, 20.0), row("checkpoint as stored", 20.0, 0.7, 45.0), row("rtn4 g128", 22.0, 0.7, 46.0, 30),
                     row("gptq4 g128", 21.5, 0.7, 46.0, 110), row("awq4 g128", 22.4, 0.7, 46.0, 90), row("rtn8 g128", 20.1, 1.1, 35.0, 30)]}


def parallel_run(mode: str, collective: str, counted: float, formula: float, ranks: list[int]) -> dict:
    return {"model": "/m/SmolLM2.gguf", "mode": mode, "world_size": 2,
            "workload": {"prompts": 1, "prompt_len": 64, "max_tokens": 32, "repeats": 3},
            "single_s": [0.5, 0.55, 0.6], "single_threads": 2, "threads_per_rank": 1, "parallel_s": [0.8, 0.85, 0.9], "tokens_per_run": 96, "speedup": 0.65,
            "collective": collective, "bytes_per_token_counted": counted, "bytes_per_token_formula": formula, "formula": "(2L+1) H e",
            "calls_per_forward": 61, "logits_gather_bytes_per_sampled_token": 98304, "broadcast_bytes_counted": 24731, "collective_seconds": {},
            "communication_share": 0.66, "rank0_idle_share": 0.4, "whole_weight_bytes": 600 * 2**20,
            "rank_weight_bytes": [r * 2**20 for r in ranks], "rank_kv_cache_bytes": [2**20, 2**20],
            "hardware_model": {"name": "8x H100 SXM (NVLink)"}, "modelled_speedup_batch1": 0.2 if mode == "tensor" else None,
            "expert_pairs_per_rank": None}


def parallel_section() -> dict:
    return {"modes": {"tensor": parallel_run("tensor", "all_reduce", 140544.0, 140544.0, [330, 290]),
                      "sequence": parallel_run("tensor", "reduce_scatter + all_gather", 140544.0, 140544.0, [330, 290]),
                      "pipeline": parallel_run("pipeline", "send", 2400.0, 2304.0, [400, 200])},
            "errors": {}, "torch_threads": 2, "sizes": FeatureSizes.for_scale(0.25).record("parallel_")}


def feature_results() -> dict:
    return dict(fake_results(), spec=spec_section(), quant=quant_section(), parallel=parallel_section())


def test_the_goals_table_judges_each_feature_number_from_the_results():
    text = report.render_markdown(feature_results())
    assert "| 11 | `spec` batch 1 greedy, code-edit: n-gram output tok/s over plain | >= 2x | 2.50x (acceptance 70%) | met |" in text
    assert "| 11 | `spec` batch 1 greedy, quote-summary: n-gram output tok/s over plain | >= 2x | 1.50x (acceptance 70%) | **missed** |" in text
    assert "free-story: n-gram" not in text  # the control workload has no 2x goal
    assert "| 11 | `spec` batch 1: slowest workload and proposer over plain (adaptive K) | >= 0.9x | 0.85x (free-story, ngram) | **missed** |" in text
    assert "| 11 | `spec` batch 1 greedy, code-edit: draft-model output tok/s over plain | reported | 1.30x (acceptance 95%) | reported |" in text
    assert "| 11 | `spec` batch 1 greedy, code-edit: Medusa output tok/s over plain | reported | 0.90x (acceptance 10%) | reported |" in text
    assert "first batch where n-gram stops paying | reported | 8 | reported |" in text
    assert "| 10 | `quant` 4-bit g128 perplexity: GPTQ / RTN | <= 1.00x | 0.98x | met |" in text
    assert "| 10 | `quant` 4-bit g128 perplexity: AWQ / RTN | <= 1.00x | 1.02x | **missed** |" in text
    assert "| 10 | `quant` every 4-bit method: perplexity over float32 (worst) | <= +10% (stated bound) | +12.0% (awq4 g128) | **missed** |" in text
    assert "| 10 | `quant` every 8-bit method: perplexity over float32 (worst) | <= +1% (stated bound) | +0.5% (rtn8 g128) | met |" in text
    assert "| >= 2.5x | 2.25x (`quant` table, checkpoint as stored vs float32) | **missed** |" in text
    assert "`batch1` 4-bit GGUF in its blocks (`--dtype auto`): ember / llama.cpp decode tok/s, same run | >= 1x | not measured | — |" in text
    assert "| 12 | `parallel` tensor parallel x2: all_reduce bytes per token per rank, counted / formula | 1.00x (within 1%) | 1.00x (140,544 / 140,544 bytes) | met |" in text
    assert "| 12 | `parallel` tensor + sequence parallel x2: reduce_scatter + all_gather bytes per token per rank, counted / formula |" in text
    assert "| 12 | `parallel` pipeline parallel x2: send bytes per token per rank, counted / formula | 1.00x (within 1%) | 1.04x (2,400 / 2,304 bytes) | **missed** |" in text
    assert "| 12 | `parallel` tensor parallel x2: largest rank's weight bytes over whole model / 2 | <= 1.15x (~1/T each) | 1.10x | met |" in text
    assert "| 12 | `parallel` pipeline parallel x2: largest rank's weight bytes over whole model / 2 | <= 1.15x (~1/T each) | 1.33x | **missed** |" in text
    assert "| 12 | `parallel` tensor parallel x2 over one process, measured here | reported | 0.65x (torch threads per rank: 1, one shared CPU box) | reported |" in text
    assert "| torch threads per rank (one process: 2) | 1 |" in text
    assert "| 12 | `parallel` pipeline parallel x2: rank 0 idle waiting for later stages (bubble, no micro-batches) | reported | 40.0% | reported |" in text
    assert "| 12 | `parallel` tensor parallel x2: modelled batch-1 decode speedup | reported | 0.20x (8x H100 SXM (NVLink)) | reported |" in text
    assert "pipeline parallel x2: modelled" not in text
    closing = text[text.index("## Closing note"):]
    assert "`quant` 4-bit g128 perplexity: AWQ / RTN" in closing and "GPTQ / RTN" not in closing


def test_a_same_run_batch1_at_dtype_auto_is_preferred_for_the_4bit_speedup():
    results = feature_results()
    results["batch1"]["ember_auto_vs_float32"] = 2.7
    text = report.render_markdown(results)
    assert "| batch-1 decode with 4-bit weights over ember's own float32 | >= 2.5x | 2.70x (`batch1`, dtype auto vs float32) | met |" in text


def test_feature_sections_show_their_tables_and_what_was_scaled():
    text = report.render_markdown(feature_results())
    assert "| code-edit | 380–402 | ngram | 10.0 (9.0–11.0) | 25.0 (22.5–27.5) | 2.50x | 2.75x | 70% | 3.10 | 0.10 | 0.50 |" in text
    assert "| 8 | 60.0 (54.0–66.0) | 48.0 (43.2–52.8) | 0.80x | 70% |" in text
    assert "Crossover: n-gram stops paying at batch 8." in text
    assert "(its own 4-bit blocks: a self-draft)" in text
    assert "Scaled down for this run: batch sizes 1, 8 (full size 1, 4, 8, 16); mixed requests 8 (full size 16)." in text
    assert "| gptq4 g128 | 21.500 | +7.5% | 0.700 | 0.630 | 46.0 | 2.30x | 110 |" in text
    assert "methods rtn4, gptq4, awq4, nf4, rtn8, fp8, sq8 (full size rtn4, gptq4, awq4, nf4, rtn8, gptq8, fp8, sq8)" in text
    assert "## `parallel`: parallel modes against one process" in text
    assert "### tensor + sequence parallel, 2 ranks, vs one process\n\n| measure | value |" in text
    assert "| all_reduce bytes per token per rank, counted | 140544.0 |" in text
    assert "Expert parallel needs an MoE model: not run here." in text


def test_a_failed_parallel_mode_is_shown_and_the_other_kept():
    results = feature_results()
    del results["parallel"]["modes"]["pipeline"]
    results["parallel"]["errors"]["pipeline"] = "RuntimeError: stage 1 died"
    text = report.render_markdown(results)
    assert "- **pipeline** failed: `RuntimeError: stage 1 died`" in text
    assert "`parallel` tensor parallel x2: all_reduce bytes per token" in text and "`parallel` pipeline parallel x2" not in text


def test_a_sequence_split_counts_bytes_per_padded_token_and_shows_the_padding():
    results = feature_results()
    results["parallel"]["modes"]["sequence"].update(tokens_per_run=95, counted_tokens_per_run=126)
    text = report.render_markdown(results)
    assert "| reduce_scatter + all_gather bytes per padded token per rank, counted | 140544.0 |" in text
    assert "| tokens per run, computed / padded to a multiple of 2 for the split | 95 / 126 (1.33x) |" in text
    assert "140,544 / 140,544 bytes per padded token (126 padded for 95 computed: 1.33x)" in text
    assert "| all_reduce bytes per token per rank, counted | 140544.0 |" in text  # no split, no padding


def test_from_results_redraws_the_feature_plots_next_to_their_tables(tmp_path):
    results_file = tmp_path / "results.json"
    results_file.write_text(json.dumps(feature_results()))
    report_path = tmp_path / "BENCHMARKS.md"
    rerender(results_file, report_path, tmp_path / "benchmarks")
    text = report_path.read_text()
    for key, png in (("spec", "spec_acceptance.png"), ("quant", "quant.png"), ("parallel", "parallel.png")):
        assert (tmp_path / "benchmarks" / "plots" / png).read_bytes()[:4] == b"\x89PNG"
        assert f"![{key}](benchmarks/plots/{png})" in text
    assert text.index("![spec]") < text.index("## `quant`") < text.index("![quant]") < text.index("## `parallel`")
    goals = json.loads((tmp_path / "benchmarks" / "results" / "summary.json").read_text())["goals"]
    assert {"issue": 10, "goal": "`quant` 4-bit g128 perplexity: GPTQ / RTN", "target": "<= 1.00x", "value": 21.5 / 22.0,
            "verdict": "met"} in goals


def test_feature_sections_are_known_to_bench_all_and_sized_by_scale():
    assert {"spec", "quant", "parallel"} <= set(SECTIONS)
    assert FeatureSizes.for_scale(1.0) == FeatureSizes()
    small = FeatureSizes.for_scale(0.25)
    assert (small.spec_prompts, small.spec_batch_sizes, small.spec_mixed_requests) == (3, (1, 8), 8)  # prompts never scale
    assert (small.quant_eval_windows, small.quant_calib_tokens, small.parallel_prompts) == (4, 2048, 1)  # the quant floors
    assert small.spec_output_len == FeatureSizes().spec_output_len  # lengths never scale
    options = BenchOptions(repeats=2)
    assert planned_runs(options, small, "spec") == (3 * 5 + 2 * 2 + 2) * 2  # plain, ngram, draft, medusa, eagle on three workloads
    assert planned_runs(options, small, "quant") == 2 + 2 * 7 + 1  # gptq8 dropped below scale 0.5; sq8 adds its kernel timings
    from ember.bench.suite import SiblingPair

    sibling = BenchOptions(repeats=7, spec_sibling=SiblingPair.parse("qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct"))
    assert planned_runs(sibling, small, "spec") == (3 * 5 + 2 * 2 + 2) * 7 + 3 * 3 * 5  # plain, ngram, draft with the sibling target, 5 repeats
    also = BenchOptions(repeats=2, quant_also=("qwen2.5-coder-0.5b-instruct",))
    assert planned_runs(also, small, "quant") == 2 * (2 + 2 * 7) + 1  # a further model: its own table, no kernel timings
    assert planned_runs(options, small, "parallel") == 4  # tensor, tensor + sequence, pipeline, tensor on the quantized weights


def test_bad_feature_sizes_and_unknown_sections_say_what_to_do():
    with pytest.raises(ValueError, match="at least 1: spec_prompts"):
        FeatureSizes(spec_prompts=0)
    with pytest.raises(ValueError, match="choose from spec, quant, parallel"):
        planned_runs(BenchOptions(), FeatureSizes(), "medusa")


def test_the_quant_section_shows_the_w8a8_product_timings_when_it_has_them():
    timings = [{"layer": "qkv", "rows": 1, "in": 576, "out": 960, "compiled_us": 20.0, "torch_us": 30.0, "int_mm_us": 50.0,
                "float32_us": 60.0, "torch_over_compiled": 1.5, "int_mm_over_compiled": 2.5}]
    text = report.render_markdown(dict(feature_results(), quant=dict(quant_section(), w8a8_kernels=timings)))
    assert "| qkv | 1 | 576 -> 960 | 20.0 | 30.0 | 50.0 | 60.0 | 1.50x | 2.50x |" in text
    assert "W8A8 (SmoothQuant) product paths" not in report.render_markdown(feature_results())


def test_a_proposer_that_adaptive_k_kept_off_reads_never_drafted_not_zero_acceptance():
    from ember.bench.spec import acceptance_text

    assert acceptance_text({"acceptance_rate": 0.0, "accepted_histogram": [0, 0, 0, 0, 0]}) == "never drafted"
    assert acceptance_text({"acceptance_rate": 0.0, "accepted_histogram": [3, 0, 0, 0, 0]}) == "0%"
    assert acceptance_text({"acceptance_rate": 0.88, "accepted_histogram": [1, 0, 2, 0, 9]}) == "88%"


def test_quant_rows_carry_the_standard_error_of_their_change_across_windows():
    from ember.bench.quant import change_standard_error

    float_windows = (20.0, 30.0, 40.0, 25.0)
    assert change_standard_error(tuple(1.1 * p for p in float_windows), float_windows) == pytest.approx(0.0, abs=1e-9)  # the same ratio everywhere
    spread = change_standard_error((22.0, 31.5, 46.0, 26.0), float_windows)
    assert 1.0 < spread < 5.0
    assert change_standard_error((22.0,), (20.0,)) is None  # one window: no spread to measure
    section = quant_section()
    section.update(eval_tokens=2048, eval_windows=4)
    section["rows"][2]["ppl_vs_float_se_pct"] = 1.53
    text = report.render_markdown(dict(feature_results(), quant=section))
    assert "(2048 tokens in 4 consecutive windows of 512, NLL pooled;" in text
    assert "| rtn4 g128 | 22.000 | +10.0% ± 1.5 |" in text


def test_a_further_model_of_the_quant_section_gets_its_own_table_plot_and_goals(tmp_path):
    larger = dict(quant_section(), model="/m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    larger["rows"] = [dict(row, perplexity=row["perplexity"] * 0.5, ppl_vs_float_pct=row["ppl_vs_float_pct"] / 2) for row in larger["rows"]]
    larger["rows"][3] = dict(larger["rows"][3], perplexity=12.0)  # GPTQ worse than RTN (11.0) on this one
    results_file = tmp_path / "results.json"
    results_file.write_text(json.dumps(dict(feature_results(), quant=dict(quant_section(), also=[larger]))))
    report_path = tmp_path / "BENCHMARKS.md"
    rerender(results_file, report_path, tmp_path / "benchmarks")
    text = report_path.read_text()
    png = "quant_qwen2_5_coder_0_5b_instruct_q4_k_m_gguf.png"
    assert (tmp_path / "benchmarks" / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    assert text.index("![quant](") < text.index("### `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`") < text.index(f"(benchmarks/plots/{png})")
    assert "| rtn4 g128 | 11.000 |" in text and "| rtn4 g128 | 22.000 |" in text  # both tables
    assert ("| 10 | `quant` on qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 4-bit g128 perplexity: GPTQ / RTN | <= 1.00x | 1.09x "
            "| **missed** |") in text
    assert "| 10 | `quant` 4-bit g128 perplexity: GPTQ / RTN | <= 1.00x | 0.98x | met |" in text  # the first model's rows unchanged
    assert "| 10 | `quant` on qwen2.5-coder-0.5b-instruct-q4_k_m.gguf every 8-bit method: perplexity over float32 (worst) |" in text


def test_a_sibling_pair_gets_its_batch1_table_and_reported_goals_and_counts_for_the_slowest():
    section = spec_section()
    sibling_entry = {"plain": _engine(5.0), "ngram": _engine(6.0, 1.2, 0.6, (1, 1, 1, 1, 4)),
                     "draft": _engine(4.0, 0.8, 0.5, (2, 1, 1, 1, 1)), "prompt_len": [400], "output_len": 128}
    section["sibling"] = {"target": "/m/qwen2.5-coder-1.5b.gguf", "draft": "/m/qwen2.5-coder-0.5b.gguf", "dtype": "auto",
                          "repeats": 3, "batch1": {"code-edit": sibling_entry}}
    text = report.render_markdown(dict(feature_results(), spec=section))
    assert "target `qwen2.5-coder-1.5b.gguf`, draft `qwen2.5-coder-0.5b.gguf`, both at dtype auto" in text
    assert "chat template; 3 interleaved repeats)" in text
    assert "| code-edit | 400 | draft | 5.0 (4.5–5.5) | 4.0 (3.6–4.4) | 0.80x |" in text
    assert ("| 11 | `spec` batch 1 greedy, code-edit, qwen2.5-coder-1.5b.gguf with qwen2.5-coder-0.5b.gguf: the smaller sibling "
            "as draft model, output tok/s over plain | reported | 0.80x (acceptance 50%) | reported |") in text
    assert ("| 11 | `spec` batch 1: slowest workload and proposer over plain (adaptive K) | >= 0.9x "
            "| 0.80x (code-edit (qwen2.5-coder-1.5b.gguf), draft) | **missed** |") in text


def test_a_workload_with_a_lookup_ceiling_shows_it_beside_its_ngram_goal_and_under_the_table():
    results = feature_results()
    results["spec"]["batch1"]["quote-summary"]["lookup_ceiling"] = {"depth": 4, "decode": 1.68, "overall": 1.55, "decode_share": 0.85,
                                                                   "max_depth": 16, "max_depth_decode": 1.8, "max_depth_overall": 1.63}
    text = report.render_markdown(results)
    assert ("| 11 | `spec` batch 1 greedy, quote-summary: n-gram output tok/s over plain | >= 2x | 1.50x (acceptance 70%; "
            "lookup ceiling x1.55 at K=4 (decode x1.68), x1.63 at K=16 (decode x1.80)) | **missed** |") in text
    assert "bound any n-gram proposer's decode speed-up" in text
    assert "quote-summary lookup ceiling x1.55 at K=4" in text
    assert "code-edit lookup ceiling" not in text  # a run without the measure shows none


def test_the_slowest_row_shows_each_repeats_own_ratio_and_whether_the_proposer_ever_drafted():
    section = spec_section()
    never = _engine(8.0, 0.8, 0.0, (0, 0, 0, 0, 0))
    never["tok_s"]["values"] = [7.0, 9.5, 8.0]
    section["batch1"]["free-story"] = {"plain": _engine(10.0), "draft": never, "prompt_len": [41], "output_len": 128}
    section["batch1"]["free-story"]["plain"]["tok_s"]["values"] = [7.0, 10.0, 10.0]
    text = report.render_markdown(dict(feature_results(), spec=section))
    assert ("| 11 | `spec` batch 1: slowest workload and proposer over plain (adaptive K) | >= 0.9x | 0.80x (free-story, draft; "
            "never drafted; per-repeat ratios 1.00, 0.95, 0.80: median 0.95x) | **missed** |") in text  # the verdict stays the medians'


def test_a_quantized_checkpoint_is_said_to_be_re_quantized_by_every_method_and_a_float_one_is_not():
    text = report.render_markdown(feature_results())
    assert "The checkpoint is quantized (0.700 bytes/param as stored), so the float32 model is its blocks dequantized" in text
    section = quant_section()
    section["rows"][1]["bytes_per_parameter"] = 2.0  # a bfloat16 checkpoint
    assert "The checkpoint is quantized" not in report.render_markdown(dict(feature_results(), quant=section))


def test_the_spec_section_names_each_proposers_draft_length_cap_where_they_differ():
    section = dict(spec_section(), num_speculative_tokens={"ngram": 8, "draft": 4, "medusa": 4})
    text = report.render_markdown(dict(feature_results(), spec=section))
    assert "target dtype float32, K: ngram 8, draft 4, medusa 4 with adaptive K" in text
    same = dict(spec_section(), num_speculative_tokens={"ngram": 4, "draft": 4})
    assert "target dtype float32, K=4 with adaptive K" in report.render_markdown(dict(feature_results(), spec=same))
    assert "target dtype float32, K=4 with adaptive K" in report.render_markdown(feature_results())  # results before per-proposer K


def test_the_prefix_section_shows_tokens_served_by_each_cache_and_their_ratio():
    def cache(served, ttft):
        return {"prompt_tokens": 1000, "served_tokens": served, "hit_rate": served / 1000, "ttft_s": _spread(ttft)}

    workload = {"radix": cache(500, 0.2), "hash": cache(400, 0.25), "requests": 12, "rounds": 3, "served_ratio": 1.25, "ttft_ratio": 0.8}
    nothing = {"radix": cache(0, 0.3), "hash": cache(0, 0.3), "requests": 4, "rounds": 1, "served_ratio": None, "ttft_ratio": 1.0}
    section = {"dtype": "auto", "repeats": 2, "output_len": 8, "workloads": {"few-shot": workload, "shared-prefix": nothing}}
    text = report.render_markdown(dict(fake_results(), prefix=section))
    assert "## `prefix`: radix-tree vs block-hash prefix cache (`ember bench prefix`)" in text
    assert "| few-shot | 12 (3) | 1000 | 500 (50%) | 400 (40%) | 1.25x | 200 (180-220) | 250 (225-275) | 0.80x |" in text
    assert "| shared-prefix | 4 (1) | 1000 | 0 (0%) | 0 (0%) | n/a |" in text
