"""Report rendering from a fake results dict: summary.json's shape, goal verdicts, tables, plots."""

from __future__ import annotations

import json

from ember.bench import report


def _spread(median, low=None, high=None):
    return {"median": median, "min": low if low is not None else median, "max": high if high is not None else median, "values": [median]}


def _run(ttft, itl):
    return {"ttft_s": ttft, "itl_s": {"main": itl, "decoder": itl}}


def fake_results() -> dict:
    mixed_entry = {
        "ember": {"tok_s": _spread(300.0, 290.0, 310.0), "num_steps": [263], "runs": []},
        "ember_static": {"tok_s": _spread(150.0), "num_steps": [400], "runs": []},
        "hf": {"tok_s": _spread(50.0), "computed_tok_s": _spread(80.0), "output_padding_waste_pct": 37.5, "prompt_padding_waste_pct": 20.0,
               "settings": {"attention_implementation": "sdpa", "kv_cache": "dynamic"}, "runs": []},
        "ratio_hf": 6.0,
        "ratio_llamacpp": None,
        "ratio_static": 2.0,
    }
    return {
        "command": "ember bench all --report BENCHMARKS.md --scale 0.5",
        "started_at": "2026-01-01 09:00 UTC",
        "finished_at": "2026-01-01 09:20 UTC",
        "commit": "abc123",
        "machine": {"cpu_model": "Test CPU", "cpu_flags": ["avx2"], "torch": "2.13.0"},
        "options": {"model": "m", "repeats": 3, "scale": 0.5},
        "skipped": {"llamacpp": "not installed"},
        "errors": {},
        "roofline": {"bandwidth_gb_s": _spread(20.0), "method": "C probe", "threads": 2, "array_bytes": 1 << 30,
                     "matmul_gflops": {"float32": 100.0, "bfloat16": 50.0}, "bytes_per_token": {"float32": 500e6},
                     "roofline_tok_s": {"float32": 40.0}},
        "mixed": {"workload": {"distribution": "log-normal"}, "num_requests": 32, "static_batch_size": 16, "output_tokens": 3000, "prompt_tokens": 5000,
                  "dtype": {"float32": mixed_entry}},
        "batch1": {"workload": {"prompt_len": 128, "output_len": 128}, "bandwidth_gb_s": 20.0,
                   "dtype": {"float32": {"ember": {"decode_tok_s": _spread(30.0), "tok_s": _spread(28.0)},
                                         "bandwidth_gb_s": _spread(20.0), "probes_gb_s": [[19.0, 21.0]], "roofline_tok_s": 40.0,
                                         "roofline_pct": 75.0, "roofline_pct_runs": [75.0], "bytes_per_token": 500e6,
                                         "decode_bytes": {"weight_bytes": 499e6, "kv_bytes": 1e6, "context_len": 192,
                                                          "kv_bytes_per_token": 5208, "tied_embeddings": True, "total": 500e6}}}},
        "shared_prefix": {"workload": {"prefix_len": 1024, "question_len": 32, "output_len": 16}, "num_requests": 32, "dtype": "float32",
                          "on": {"mean_ttft_s": _spread(1.0), "tok_s": _spread(10.0), "prefix_reuse_pct": _spread(95.0), "runs": [_run([1.0, 2.0], [])]},
                          "off": {"mean_ttft_s": _spread(8.0), "tok_s": _spread(2.0), "prefix_reuse_pct": _spread(0.0), "runs": [_run([8.0], [])]},
                          "ttft_ratio": 8.0, "prefix_reuse_pct": 95.0},
        "long_prefill": {"workload": {"num_decoders": 16}, "dtype": "float32", "chunk_tokens": 256, "off_budget_tokens": 4096,
                         "on": {"label": "on", "p50_itl_ms": _spread(50.0), "p99_itl_ms": _spread(100.0), "max_itl_ms": _spread(120.0),
                                "long_ttft_ms": _spread(900.0), "tok_s": _spread(100.0), "runs": [_run([], [0.05, 0.1])]},
                         "off": {"label": "off", "p50_itl_ms": _spread(50.0), "p99_itl_ms": _spread(200.0), "max_itl_ms": _spread(900.0),
                                 "long_ttft_ms": _spread(800.0), "tok_s": _spread(100.0), "runs": [_run([], [0.05, 0.9])]},
                         "p99_itl_ratio": 2.0, "p50_itl_ratio": 1.0},
        "serve": {"target": "ember serve (float32)", "num_requests": 16, "concurrency": 16, "request_rate": None,
                  "slo": {"ttft_ms": 2000.0, "tpot_ms": 200.0}, "tok_s": _spread(40.0), "mean_ttft_ms": _spread(100.0),
                  "p99_ttft_ms": _spread(200.0), "mean_tpot_ms": _spread(50.0), "p99_itl_ms": _spread(80.0),
                  "goodput_req_s": _spread(1.0), "errors": 0, "runs": [],
                  "vs_offline": {"tok_s": {"served": _spread(40.0), "offline": _spread(50.0)}, "tok_s_ratio": 0.8,
                                 "batch1_tpot_ms": {"served": _spread(66.0), "offline": _spread(60.0)}, "batch1_tpot_ratio": 1.1,
                                 "e2e_batch1_tok_s": {"served": _spread(95.0), "offline": _spread(100.0)}, "e2e_batch1_ratio": 0.95}},
    }


def test_summary_has_the_issue_shape_with_null_for_peers_not_run():
    s = report.summary(fake_results())
    assert set(s) == {"mixed", "batch1", "shared_prefix", "long_prefill", "serve", "machine", "commit"}
    f32 = s["mixed"]["dtype"]["float32"]
    assert f32 == {"ember_tok_s": 300.0, "hf_tok_s": 50.0, "llamacpp_tok_s": None, "vllm_tok_s": None, "ratio_hf": 6.0, "ratio_llamacpp": None,
                   "ratio_vllm": None}
    assert s["mixed"]["dtype"]["bfloat16"]["ember_tok_s"] is None
    assert s["batch1"] == {"ember_tok_s": 30.0, "roofline_tok_s": 40.0, "roofline_pct": 75.0, "hf_tok_s": None, "llamacpp_tok_s": None,
                           "vllm_tok_s": None}
    assert s["shared_prefix"] == {"ttft_ratio": 8.0, "prefix_reuse_pct": 95.0}
    assert s["long_prefill"] == {"p99_itl_ratio": 2.0}
    assert s["serve"] == {"batch1_tpot_ratio": 1.1, "tok_s_ratio": 0.8, "e2e_batch1_ratio": 0.95}
    json.dumps(s)  # machine-readable as is


def test_markdown_states_command_goals_peers_and_tables():
    text = report.render_markdown(fake_results())
    assert "ember bench all --report BENCHMARKS.md --scale 0.5" in text
    assert "| `mixed` float32: ember / HF transformers output tok/s | >= 5x | 6.00x | met |" in text
    assert "| `batch1` float32: decode tok/s as % of the memory roofline | >= 90% | 75.0% | **missed** |" in text
    assert "| `long-prefill`: decoders' p99 ITL, chunked prefill off / on | >= 3x | 2.00x | **missed** |" in text
    assert "not measured" in text  # llama.cpp ratio
    assert "**llamacpp**: not installed" in text
    assert "300.0 (290.0–310.0)" in text
    assert "Missed:" in text
    assert "commit `abc123` (clean tree)" in text


def test_markdown_shows_hf_padding_peer_settings_static_steps_and_served_vs_offline():
    text = report.render_markdown(fake_results())
    assert "| float32 | HF transformers | 50.0 (50.0–50.0) | 80.0 (80.0–80.0) | 38% of generated, 20% of prompt | — | 6.00x |" in text
    assert "| float32 | ember, static batches | 150.0 (150.0–150.0) | = output | none | 400 | 2.00x |" in text
    assert "static batches of 16" in text
    assert "| HF transformers, `mixed` float32 | attention_implementation: sdpa, kv_cache: dynamic |" in text
    assert "weights 499 MB (tied embedding read whole, as the LM head) + KV cache 1.0 MB at 192 cached tokens" in text
    assert "probed right before and right after each of ember's runs" in text and "float32 20.00 (20.00–20.00) GB/s" in text
    assert "| TPOT (ms), one `batch1` request alone | 66.0 (66.0–66.0) | 60.0 (60.0–60.0) | 1.10x |" in text
    assert "| `serve` 16 streams: output tok/s served / offline (same requests) | >= 0.85x | 0.80x | **missed** |" in text
    assert "| `serve` batch 1: TPOT served / offline (same request) | <= 1.10x | 1.10x | met |" in text
    assert "| `serve` batch 1 end to end: tok/s of one whole answer, served / offline | >= 0.9x | 0.95x | met |" in text


def test_a_dropped_static_row_is_explained():
    results = fake_results()
    entry = results["mixed"]["dtype"]["float32"]
    del entry["ember_static"]
    entry["static_dropped"] = "static batches ran the same 263 engine steps as continuous batching"
    assert "float32: static-batches row dropped: static batches ran the same 263" in report.render_markdown(results)


def test_plots_are_written_as_png(tmp_path):
    plots = report.make_plots(fake_results(), tmp_path)
    assert set(plots) == {"mixed", "batch1", "shared_prefix", "long_prefill"}
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in plots.values())
    text = report.render_markdown(fake_results(), plots, tmp_path)
    assert "![mixed](mixed_throughput.png)" in text


def test_the_terminal_tables_show_the_same_figures(capsys, monkeypatch):
    from ember.bench.printing import print_section

    monkeypatch.setenv("COLUMNS", "220")  # a wide terminal: no cell wraps
    results = fake_results()
    for name, key in (("mixed", "mixed"), ("batch1", "batch1"), ("serve", "serve")):
        print_section(name, results[key], {})
    out = capsys.readouterr().out
    assert "80.0 (80.0–80.0)" in out and "38% gen, 20% prompt" in out  # HF computed tok/s and padding
    assert "HF transformers (float32): attention_implementation=sdpa" in out
    assert "KV cache 1.0 MB at 192 cached tokens" in out
    assert "served vs offline" in out and "1.10x" in out


def with_vllm(results: dict) -> dict:
    """`results` with vLLM's figures added beside ember's in mixed, batch1 and serve."""
    entry = results["mixed"]["dtype"]["float32"]
    entry["vllm"] = {"tok_s": _spread(100.0), "settings": {"vllm_version": "0.32.0", "max_num_seqs": 256}, "runs": []}
    entry["ratio_vllm"] = 3.0
    batch1 = results["batch1"]["dtype"]["float32"]
    batch1["vllm"] = {"decode_tok_s": _spread(20.0), "tok_s": _spread(18.0)}
    serve = results["serve"]
    serve["vllm"] = {"tok_s": _spread(25.0), "mean_ttft_ms": _spread(300.0), "p99_ttft_ms": _spread(400.0), "mean_tpot_ms": _spread(70.0),
                     "p99_itl_ms": _spread(90.0), "goodput_req_s": _spread(0.5), "errors": 0, "batch1_tpot_ms": _spread(45.0), "runs": []}
    serve["ratio_vllm"] = 1.6
    return results


def test_vllm_figures_get_their_own_rows_columns_and_ratios():
    results = with_vllm(fake_results())
    text = report.render_markdown(results)
    assert "| float32 | vLLM | 100.0 (100.0–100.0) | = output | none | — | 3.00x |" in text
    assert "| float32 | vLLM | 20.0 (20.0–20.0) | 18.0 (18.0–18.0) | 50% |" in text  # 20 of the 40 tok/s roofline
    assert "| vLLM, `mixed` float32 | vllm_version: 0.32.0, max_num_seqs: 256 |" in text
    assert "|  | ember serve (float32) | vLLM serve |" in text
    assert "| TPOT (ms), one `batch1` request alone | 66.0 (66.0–66.0) | 45.0 (45.0–45.0) |" in text
    assert "ember / vLLM output tok/s 1.60x" in text
    assert report.summary(results)["mixed"]["dtype"]["float32"]["ratio_vllm"] == 3.0
    assert report.summary(results)["batch1"]["vllm_tok_s"] == 20.0


def test_the_terminal_serve_table_has_a_vllm_column(capsys, monkeypatch):
    from ember.bench.printing import print_section

    monkeypatch.setenv("COLUMNS", "220")
    print_section("serve", with_vllm(fake_results())["serve"], {})
    out = capsys.readouterr().out
    assert "ember / vLLM output tok/s 1.60x" in out and "vLLM serve" in out and "45.0 (45.0–45.0)" in out
