"""The real Q4_1 SmolLM2 run in its blocks against the same model through a dequantized float32 copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from ember.quant.ggml_layers import GGMLEmbedding, GGMLLinear

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a little"]


@pytest.fixture(scope="module")
def greedy_runs(smollm2_gguf: Path) -> dict[str, tuple[list[list[int]], dict[type, int], int, torch.Tensor]]:
    """Per dtype: greedy tokens, GGML layer counts, bytes of the model's tensors, and a few embedding rows."""
    runs = {}
    for dtype in ("auto", "float32"):
        llm = LLM(str(smollm2_gguf), dtype=dtype)
        model = llm.engine.runner.model
        kinds = {kind: sum(isinstance(m, kind) for m in model.modules()) for kind in (GGMLLinear, GGMLEmbedding)}
        # Weights as the state dict sees them (packed float panels are unpacked there; GGML blocks stay blocks).
        weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values() if t.dim() == 2)
        embedded = model.model.embed_tokens(torch.tensor([0, 1, 17, 49151]))
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0.0))
        runs[dtype] = ([o.outputs[0].token_ids for o in outputs], kinds, weight_bytes, embedded)
    return runs


def test_q4_1_gguf_stays_in_blocks_by_default_and_is_float_when_asked(greedy_runs):
    # 30 layers x (qkv, o, gate_up, down) + the tied lm_head; the Q8_0 embedding table.
    assert greedy_runs["auto"][1] == {GGMLLinear: 30 * 4 + 1, GGMLEmbedding: 1}
    assert greedy_runs["float32"][1] == {GGMLLinear: 0, GGMLEmbedding: 0}
    assert greedy_runs["auto"][2] < 100_000_000 < 500_000_000 < greedy_runs["float32"][2]


def test_greedy_tokens_equal_the_dequantized_float_model(greedy_runs):
    assert greedy_runs["auto"][0] == greedy_runs["float32"][0]
    assert all(len(tokens) == 16 for tokens in greedy_runs["auto"][0])


def test_embedding_rows_are_bit_exact_with_the_float_copy(greedy_runs):
    assert torch.equal(greedy_runs["auto"][3], greedy_runs["float32"][3])
