"""The `ember` command as a user runs it, in a subprocess, on the shared real models."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _ember(*args: str, timeout_s: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.cli.main", *args], capture_output=True, text=True, timeout=timeout_s)


def test_generate_from_bos_with_an_overriding_tokenizer_prints_the_reference_story(stories_dir):
    result = _ember(
        "generate", "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
        "--prompt", "", "--max-tokens", "200", "--temperature", "0",
    )
    assert result.returncode == 0, result.stderr
    expected = (stories_dir / "greedy_200steps_from_BOS.expected.txt").read_text(encoding="utf-8")
    assert result.stdout == expected


def test_generate_with_ngram_speculation_prints_the_same_reference_story(stories_dir):
    result = _ember(
        "generate", "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
        "--prompt", "", "--max-tokens", "200", "--temperature", "0", "--speculative-method", "ngram",
        "--num-speculative-tokens", "5",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (stories_dir / "greedy_200steps_from_BOS.expected.txt").read_text(encoding="utf-8")


def test_generate_with_an_fp8_kv_cache_prints_a_story(stories_dir):
    result = _ember(
        "generate", "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
        "--prompt", "Once upon a time", "--max-tokens", "40", "--temperature", "0", "--kv-cache-dtype", "fp8",
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) > 10


def test_generate_held_to_a_json_schema_prints_a_value_of_it_and_a_bad_schema_is_named(stories_dir, tmp_path):
    schema = {"type": "object", "properties": {"happy": {"type": "boolean"}, "mood": {"enum": ["calm", "busy"]}},
              "required": ["happy", "mood"], "additionalProperties": False}  # fmt: skip
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    model = ("--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"))
    result = _ember("generate", *model, "--prompt", "Lily was", "--max-tokens", "200", "--temperature", "0", "--json-schema", str(path))
    assert result.returncode == 0, result.stderr
    value = json.loads(result.stdout)
    assert isinstance(value["happy"], bool) and value["mood"] in ("calm", "busy")
    path.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    refused = _ember("generate", *model, "--prompt", "Lily was", "--json-schema", str(path))
    assert refused.returncode != 0 and "uniqueItems" in refused.stderr


def test_eval_perplexity_prints_the_figure_and_token_count(stories_dir, tmp_path):
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time, there was a little girl named Lily. She loved to play outside.", encoding="utf-8")
    result = _ember(
        "eval", "perplexity", "--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin"),
        "--file", str(text), "--max-tokens", "1024",
    )
    assert result.returncode == 0, result.stderr
    figure, count = result.stdout.split("perplexity: ")[1].split(" (")
    assert 1.0 < float(figure) < 10.0
    assert count.startswith(tuple("0123456789")) and count.strip().endswith("tokens)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--model", "no/such/model.gguf", "--prompt", "hi"], "neither an existing path nor a registered model"),
        (["generate", "--model", "smollm2-135m-instruct-nope", "--prompt", "hi"], "registered model"),
        (["generate", "--model", "m.gguf", "--prompt", "hi", "--kv-cache-dtype", "int4"],
         "--kv-cache-dtype: invalid choice: 'int4' (choose from 'auto', 'float32', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2')"),
    ],
)
def test_a_bad_model_name_is_a_clear_error_not_a_traceback(args, message):
    result = _ember(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_model_without_a_tokenizer_asks_for_one(stories_dir):
    result = _ember("generate", "--model", str(stories_dir / "stories260K.bin"), "--prompt", "hi")
    assert result.returncode == 2
    assert "--tokenizer" in result.stderr
