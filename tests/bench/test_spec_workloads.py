"""`ember bench spec` workloads: deterministic, chat-templated, grounded in their prompts."""

from __future__ import annotations

import pytest

from ember.bench.spec import _crossover
from ember.bench.spec_workloads import SPEC_WORKLOADS, build_spec_workload


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from ember.tokenizers import load

    return load(smollm2_gguf)


def test_every_workload_is_the_same_for_the_same_seed_and_differs_for_another(tokenizer):
    for name in SPEC_WORKLOADS:
        first = build_spec_workload(name, tokenizer, seed=0, num_requests=2, output_len=16)
        again = build_spec_workload(name, tokenizer, seed=0, num_requests=2, output_len=16)
        other = build_spec_workload(name, tokenizer, seed=1, num_requests=2, output_len=16)
        assert [r.prompt_token_ids for r in first.requests] == [r.prompt_token_ids for r in again.requests]
        assert [r.prompt_token_ids for r in first.requests] != [r.prompt_token_ids for r in other.requests]


def test_the_code_edit_prompt_is_chat_templated_and_holds_the_code_to_copy(tokenizer):
    request = build_spec_workload("code-edit", tokenizer, num_requests=1).requests[0]
    text = tokenizer.decode(request.prompt_token_ids)
    assert text.count("def ") == 5 and "return result" in text
    assert "<|im_start|>assistant" in text  # SmolLM2's chat template


def test_an_unknown_workload_names_the_known_ones(tokenizer):
    with pytest.raises(ValueError, match="code-edit, quote-summary, free-story"):
        build_spec_workload("poetry", tokenizer)


def test_the_crossover_is_the_first_batch_where_speculation_stops_paying():
    sweep = {"1": {"ngram": {"ratio": 1.6}}, "4": {"ngram": {"ratio": 1.1}}, "8": {"ngram": {"ratio": 0.95}}}
    assert _crossover(sweep) == 8
    assert _crossover({"1": {"ngram": {"ratio": 1.2}}}) is None
