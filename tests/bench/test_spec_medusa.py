"""`ember bench spec`'s Medusa heads: trained on the shared corpus once per base model, then reused from the cache."""

from __future__ import annotations

import pytest

from ember.bench.spec import SpecBenchOptions, cached_medusa_heads
from ember.bench.workloads import find_corpus_dir
from ember.engine.spec.medusa_heads import HEADS_FILE, load_medusa_heads
from ember.tokenizers import load


def test_heads_are_trained_once_per_model_and_then_reused(stories_dir, tmp_path, monkeypatch):
    if find_corpus_dir() is None:
        pytest.skip("the shared corpus is not reachable (set EMBER_SHARED)")
    monkeypatch.setenv("EMBER_HOME", str(tmp_path))
    model = str(stories_dir / "stories260K.bin")
    tokenizer = load(stories_dir / "tok512.bin")
    spec = SpecBenchOptions(methods=("medusa",), num_speculative_tokens=2, medusa_train_steps=2, train_replies=4)

    folder = cached_medusa_heads(model, "float32", spec, tokenizer)
    written = (folder / HEADS_FILE).stat().st_mtime_ns
    again = cached_medusa_heads(model, "float32", spec, tokenizer)

    assert again == folder and folder.parent == tmp_path / "medusa"
    assert (folder / HEADS_FILE).stat().st_mtime_ns == written  # not trained a second time
    assert load_medusa_heads(folder).num_heads == 2
