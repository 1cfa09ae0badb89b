"""Perplexity over one window and over several consecutive windows, on the stories260K llama2.c model."""

from __future__ import annotations

import math

import pytest

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.llm_engine import LLMEngine
from ember.eval.perplexity import perplexity, windowed_perplexity


@pytest.fixture(scope="module")
def engine(stories_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(stories_dir / "stories260K.bin"), tokenizer=str(stories_dir / "tok512.bin"),
                                  cache=CacheConfig(num_kv_blocks=64)))


TEXT = "Once upon a time, there was a little girl named Lily. She liked to play in the park with her big red ball. " * 8


def test_one_window_is_the_single_window_perplexity(engine):
    assert windowed_perplexity(engine, TEXT, 96, 1).perplexity == pytest.approx(perplexity(engine, TEXT, 96).perplexity, rel=1e-9)


def test_windows_are_scored_apart_and_pooled_token_by_token(engine):
    result = windowed_perplexity(engine, TEXT, 64, 3)
    assert result.num_tokens == 192 and len(result.window_perplexities) == 3
    pooled = math.exp(sum(math.log(p) for p in result.window_perplexities) / 3)  # equal windows: 63 scored tokens each
    assert result.perplexity == pytest.approx(pooled, rel=1e-9)
    # the first window starts at the text's start with its context; later windows start cold, mid-text
    assert result.window_perplexities[0] == pytest.approx(perplexity(engine, TEXT, 64).perplexity, rel=1e-9)


def test_a_text_too_short_for_the_windows_is_refused_naming_the_fix(engine):
    with pytest.raises(ValueError, match="fewer than 4 windows of 512"):
        windowed_perplexity(engine, "a short text", 512, 4)
