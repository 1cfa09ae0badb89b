"""Embeddings (vLLM's embed task on a decoder model): the final hidden state at the prompt's last token, normalised."""

from __future__ import annotations

import pytest
import torch
import transformers

from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.model_factory import save_tiny_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("qwen2", tmp_path_factory.mktemp("qwen2"))


def _reference(folder, prompt: list[int]) -> torch.Tensor:
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.nn.functional.normalize(model(torch.tensor([prompt])).last_hidden_state[0, -1], dim=-1)


def test_embeddings_are_transformers_last_hidden_state_normalised_beside_generation(folder):
    llm = LLM(str(folder), block_size=4, num_kv_blocks=200, max_num_batched_tokens=16)
    prompts = [[5, 6, 7, 8, 9, 10], list(range(20, 60)), [11]]
    embedded = llm.embed(prompts)
    for prompt, embedding in zip(prompts, embedded, strict=True):
        assert torch.allclose(torch.tensor(embedding), _reference(folder, prompt), atol=1e-5)
    mixed = llm.generate(prompts[:2], [SamplingParams(max_tokens=1, temperature=0, embed=True),
                                       SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)])  # fmt: skip
    assert mixed[0].embedding == pytest.approx(embedded[0], abs=1e-6) and mixed[0].outputs[0].token_ids == []
    assert mixed[1].embedding is None and len(mixed[1].outputs[0].token_ids) == 8
    again = llm.embed(prompts)  # its prefixes now cached: the same
    assert torch.allclose(torch.tensor(again), torch.tensor(embedded), atol=1e-6)
    assert llm.engine.kv.num_free_blocks == 200


def test_an_embedding_request_asks_for_one_sequence_and_one_token():
    with pytest.raises(ValueError, match="embed"):
        SamplingParams(embed=True, max_tokens=1, n=2)
    with pytest.raises(ValueError, match="embed"):
        SamplingParams(embed=True, max_tokens=4)
