"""The CLI pieces: `ember tokenize`, `ember tokenizers train|compare`, through `register`."""

from __future__ import annotations

import argparse
import json

from ember.tokenizers import load
from ember.tokenizers.cli import register


def run(argv):
    parser = argparse.ArgumentParser(prog="ember")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_tokenize_prints_ids_and_pieces(smollm2_gguf, capsys):
    assert run(["tokenize", "--tokenizer", str(smollm2_gguf), "--json", "Hi 42<|im_end|>"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pieces"] == ["Hi", " ", "4", "2", "<|im_end|>"]
    assert shown["ids"][-1] == 2


def test_train_bpe_then_load_the_result(shared_dir, tmp_path, capsys):
    corpus = shared_dir / "corpus" / "botchan.txt"
    output = tmp_path / "botchan_bpe"
    assert (
        run(
            [
                "tokenizers",
                "train",
                str(corpus),
                "--vocab-size",
                "600",
                "--output",
                str(output),
                "--special",
                "<|endoftext|>",
            ]
        )
        == 0
    )
    tokenizer = load(output.with_suffix(".json"))
    assert tokenizer.vocab_size == 600
    assert tokenizer.decode(tokenizer.encode("Botchan<|endoftext|>")) == "Botchan<|endoftext|>"


def test_compare_prints_costs_and_writes_a_png(shared_dir, tmp_path, capsys):
    english = tmp_path / "en.txt"
    english.write_text("The cat sat on the mat.\nIt was a sunny day.\n", encoding="utf-8")
    korean = tmp_path / "ko.txt"
    korean.write_text("안녕하세요. 오늘 날씨가 정말 좋네요.\n", encoding="utf-8")
    plot = tmp_path / "costs.png"
    cl100k = shared_dir / "tokenizers" / "tiktoken" / "cl100k_base.tiktoken"
    assert (
        run(
            [
                "tokenizers",
                "compare",
                "--tokenizer",
                f"cl100k={cl100k}",
                "--text",
                f"english={english}",
                "--text",
                f"korean={korean}",
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "korean" in out and "cl100k" in out and "x)" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
