"""vLLM's CPU build as a bench peer: where its environment is found, what it is told when it is not there, the worker's
protocol (the worker module's own parsing and serving loop, run here without vLLM), and one real run on SmolLM2,
skipped where the vLLM environment or the model is absent."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from ember.bench import vllm_worker
from ember.bench.results import RunResult
from ember.bench.suite import decode_tok_s, peer_unavailable
from ember.bench.vllm_runner import (
    DEFAULT_VLLM_PYTHON,
    VLLM_PYTHON_VARIABLE,
    VLLMRunner,
    run_command,
    run_result,
    thread_binding,
    vllm_available,
    vllm_python,
    worker_environment,
)
from ember.bench.workloads import BenchRequest, Workload
from tests.bench.test_levers import tiny_workload


def test_the_vllm_python_is_the_flag_else_the_variable_else_the_repository_venv(monkeypatch, tmp_path):
    monkeypatch.delenv(VLLM_PYTHON_VARIABLE, raising=False)
    assert vllm_python() == DEFAULT_VLLM_PYTHON
    assert DEFAULT_VLLM_PYTHON.parts[-3:] == (".venv-vllm", "bin", "python")
    monkeypatch.setenv(VLLM_PYTHON_VARIABLE, str(tmp_path / "from-variable"))
    assert vllm_python() == tmp_path / "from-variable"
    assert vllm_python(tmp_path / "from-flag") == tmp_path / "from-flag"


def test_a_missing_vllm_environment_says_where_it_looked_and_how_to_make_it(tmp_path):
    missing = tmp_path / "no-env" / "bin" / "python"
    reason = peer_unavailable("vllm", missing)
    assert str(missing) in reason and "make vllm-env" in reason and VLLM_PYTHON_VARIABLE in reason


def test_a_python_without_vllm_is_named_as_such():
    if vllm_available(Path(sys.executable)) is None:
        pytest.skip("this Python has vllm installed")
    reason = vllm_available(Path(sys.executable))
    assert reason.startswith(f"{sys.executable} cannot import vllm") and "make vllm-env" in reason


def test_threads_bind_to_the_first_cpus_this_process_may_use():
    allowed = sorted(os.sched_getaffinity(0))
    assert thread_binding(1) == str(allowed[0])
    assert thread_binding(len(allowed)) == ",".join(map(str, allowed))
    with pytest.raises(ValueError, match=f"1 to {len(allowed)} threads"):
        thread_binding(len(allowed) + 1)


def test_the_worker_preloads_vllms_own_tcmalloc_not_intel_openmp_and_drops_pythonpath(tmp_path, monkeypatch):
    python = tmp_path / "env" / "bin" / "python"
    tcmalloc = tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "vllm" / "libs" / "libtcmalloc_minimal.so.4"
    iomp = tmp_path / "env" / "lib" / "libiomp5.so"
    for library in (python, tcmalloc, iomp):
        library.parent.mkdir(parents=True, exist_ok=True)
        library.touch()
    monkeypatch.setenv("PYTHONPATH", "/somewhere/ember")
    monkeypatch.setenv("LD_PRELOAD", "/already/preloaded.so")
    environment = worker_environment(python, 1)
    assert environment["LD_PRELOAD"] == f"{tcmalloc}:/already/preloaded.so"
    assert "PYTHONPATH" not in environment
    assert environment["VLLM_CPU_OMP_THREADS_BIND"] == thread_binding(1) and environment["OMP_NUM_THREADS"] == "1"


def test_a_run_command_carries_the_workloads_own_tokens_and_the_worker_reads_it_back():
    workload = tiny_workload(2)
    line = json.dumps(run_command(workload, "stream"))
    command = vllm_worker.parse_command(line)
    assert command["mode"] == "stream"
    assert [(r["request_id"], r["prompt_token_ids"], r["max_tokens"]) for r in command["requests"]] == [
        (r.request_id, r.prompt_token_ids, r.max_tokens) for r in workload.requests
    ]


@pytest.mark.parametrize(("line", "message"), [
    ('{"op": "generate"}', "op is one of load, run, quit"),
    ('{"op": "load"}', "names its model folder"),
    ('{"op": "run", "mode": "fast", "requests": []}', "mode is one of offline, stream"),
    ('{"op": "run", "mode": "offline", "requests": [{"request_id": "a", "prompt_token_ids": [1], "max_tokens": 0}]}', "max_tokens of at least 1"),
])
def test_the_worker_refuses_a_malformed_command_naming_what_is_wrong(line, message):
    with pytest.raises(ValueError, match=message):
        vllm_worker.parse_command(line)


def test_the_worker_answers_every_line_and_stops_at_quit():
    commands = ['{"op": "run", "mode": "offline", "requests": []}\n', "\n", '{"op": "jump"}\n', '{"op": "quit"}\n', '{"op": "quit"}\n']
    replies = io.StringIO()
    vllm_worker.serve(commands, replies)
    answered = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert [reply["ok"] for reply in answered] == [False, False, True]  # the blank line has no reply; nothing after quit
    assert answered[0]["error"] == "ValueError: a run command came before the load command"
    assert answered[1]["error"].startswith("ValueError: a command is a JSON object whose op is one of")


def test_a_streamed_reply_becomes_a_run_result_on_the_runs_own_clock():
    workload = Workload("batch1", 0, [BenchRequest("b0", [1, 2, 3], 4)], {})
    reply = {"ok": True, "wall_s": 0.5,
             "requests": [{"request_id": "b0", "output_tokens": 4, "output_token_ids": [9, 8, 7, 6], "token_times_s": [0.2, 0.3, 0.4]}]}
    result = run_result(reply, workload, {"mode": "stream"})
    timing = result.requests[0]
    assert (result.engine, result.output_tokens, result.wall_s) == ("vllm", 4, 0.5)
    assert (timing.arrival, timing.first_token, timing.finished, timing.output_token_ids) == (0.0, 0.2, 0.4, [9, 8, 7, 6])
    assert decode_tok_s(result) == pytest.approx(3 / 0.2)  # three tokens after the first, over 0.2 s


def test_an_offline_reply_finishes_every_request_at_the_generate_calls_end_and_a_short_one_is_refused():
    workload = tiny_workload(2)  # targets 4 and 6
    done = [{"request_id": r.request_id, "output_tokens": r.max_tokens, "output_token_ids": [0] * r.max_tokens, "token_times_s": []}
            for r in workload.requests]
    result = run_result({"ok": True, "wall_s": 2.0, "requests": done}, workload, {})
    assert [(t.first_token, t.finished) for t in result.requests] == [(None, 2.0), (None, 2.0)]
    assert result.output_tok_s == (4 + 6) / 2.0
    done[1]["output_tokens"] = 5
    with pytest.raises(RuntimeError, match="vLLM made 5 tokens for request mixed-1, asked 6"):
        run_result({"ok": True, "wall_s": 2.0, "requests": done}, workload, {})


@pytest.mark.slow
def test_vllm_runs_the_mixed_and_batch1_shapes_on_smollm2(smollm2_gguf, tmp_path):
    """The real peer: vLLM's CPU build on SmolLM2 in bfloat16, loaded once (about two minutes here), two workloads."""
    reason = vllm_available()
    if reason is not None:
        pytest.skip(f"the vLLM peer cannot run here: {reason}")
    from ember.bench.suite import BenchOptions, _vllm_folder

    folder = _vllm_folder(BenchOptions(model=str(smollm2_gguf), cache_dir=tmp_path), "bfloat16")
    runner = VLLMRunner(folder, "bfloat16", threads=1)
    try:
        mixed: RunResult = runner.run(tiny_workload(3))
        single = Workload("batch1", 0, [BenchRequest("b0", list(range(100, 140)), 16)], {"prompt_len": 40, "output_len": 16})
        batch1: RunResult = runner.run(single, batch1=True)
    finally:
        runner.close()
    assert runner.process.returncode == 0
    assert mixed.output_tokens == 4 + 6 + 8 and mixed.wall_s > 0
    assert batch1.output_tokens == 16 and len(batch1.requests[0].output_token_ids) == 16
    assert 2 <= len(batch1.requests[0].token_times) <= 16 and decode_tok_s(batch1) > 0
    assert runner.settings["dtype"] == "bfloat16" and runner.settings["VLLM_CPU_OMP_THREADS_BIND"] == thread_binding(1)


@pytest.mark.slow
def test_the_folder_vllm_loads_holds_the_very_weights_ember_runs(smollm2_gguf, tmp_path):
    """The transformers folder made from the GGUF (about 25 s): no GGUF quantization left in its config, and its
    bfloat16 tensors equal to the bit to ember's own, q/k rows in transformers' order (ember fuses q, k, v)."""
    from safetensors.torch import load_file

    from ember.bench.ember_runner import loaded_weights
    from ember.bench.gguf_export import export_hf_folder

    folder = export_hf_folder(smollm2_gguf, tmp_path / "smollm2.hf-bfloat16", "bfloat16")
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    exported = load_file(folder / "model.safetensors")
    ember = loaded_weights(str(smollm2_gguf), "bfloat16").model.state_dict()
    q_rows, kv_rows = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    qkv = ember["model.layers.0.self_attn.qkv_proj.weight"]
    assert exported["model.layers.0.self_attn.q_proj.weight"].equal(qkv[:q_rows])
    assert exported["model.layers.0.self_attn.k_proj.weight"].equal(qkv[q_rows:q_rows + kv_rows])
    assert exported["model.embed_tokens.weight"].equal(ember["model.embed_tokens.weight"])
    assert exported["model.layers.29.mlp.down_proj.weight"].equal(ember["model.layers.29.mlp.down_proj.weight"])
    assert (folder / "tokenizer.json").is_file()


def test_a_failed_load_raises_vllms_own_error_and_ends_the_worker(tmp_path):
    reason = vllm_available()
    if reason is not None:
        pytest.skip(f"the vLLM peer cannot run here: {reason}")
    missing = tmp_path / "no-such-model"
    with pytest.raises(RuntimeError, match="the vLLM worker failed on 'load'") as failure:
        VLLMRunner(missing, "bfloat16", threads=1)
    assert str(missing) in str(failure.value)
    assert _worker_children() == []


def _worker_children() -> list[int]:
    """Process ids of this process's children that run the vLLM worker script, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"vllm_worker.py" in command:
            found.append(int(entry.name))
    return found
