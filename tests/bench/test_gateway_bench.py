"""The gateway benchmark's shared-prefix workload: documents x questions, each document's
requests sharing a long prefix and differing after it."""

from __future__ import annotations

import collections

import pytest

from ember.bench.gateway import GatewayBenchSettings, build_requests


def test_each_document_is_asked_every_question_with_a_shared_prefix():
    prompts = build_requests(documents=3, doc_chars=600, questions=4, seed=1)
    assert len(prompts) == 12 and len(set(prompts)) == 12
    by_prefix = collections.Counter(prompt[:600] for prompt in prompts)
    assert sorted(by_prefix.values()) == [4, 4, 4]
    assert build_requests(documents=3, doc_chars=600, questions=4, seed=1) == prompts


def test_settings_refuse_empty_workloads():
    with pytest.raises(ValueError, match="--documents must be at least 1"):
        GatewayBenchSettings(documents=0)
