"""Phi-3's LongRoPE (Phi-3.5-mini, Phi-3-*-128k) and partial rotary (Phi-4-mini: 3/4 of each head rotates) against
transformers, from an HF folder and from a GGUF.

A tiny context (original 16 of 64 positions: factor 4, attention factor sqrt(1 + ln 4 / ln 16)) so prompts and a
generation past the original context run in a test. A model served with a context past the original one rotates
with the long factors, as vLLM and llama.cpp do for such a context; transformers does the same for every sequence
longer than the original context (recomputing a cached one when it grows past it), so those are compared; served
within the original context, the short factors, which transformers uses for sequences that short.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter

from ember.gguf_file import GGUFFile
from ember.models.family_registry import config_from_hf
from ember.models.gguf_loader import read_gguf_config
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_prompt_logits_match,
    load_reference,
    reference_greedy,
    save_random_model,
    single_thread_torch,
)
from tests.models.test_gguf_loader import finish_gguf, write_gguf

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB, ORIGINAL, HEAD_DIM = 256, 16, 16
PROMPTS = [[5, 9, 14, 200, 3, 77, 8, 8, 40, 41, 7, 7, 90, 91, 92, 3, 200], list(range(30, 70))]  # past the original 16


@pytest.fixture(scope="module")
def longrope_folder(tmp_path_factory):
    return _save_phi3(tmp_path_factory.mktemp("longrope"), partial_rotary_factor=1.0)


@pytest.fixture(scope="module")
def partial_folder(tmp_path_factory):
    """Phi-4-mini's shape of rotation: LongRoPE over the leading 12 of each head's 16 dims."""
    return _save_phi3(tmp_path_factory.mktemp("partial"), partial_rotary_factor=0.75)


def _save_phi3(folder, partial_rotary_factor: float):
    rotary_dim = int(HEAD_DIM * partial_rotary_factor)
    generator = torch.Generator().manual_seed(3)
    short, long = (1 + torch.rand(rotary_dim // 2, generator=generator)).tolist(), (2 + 6 * torch.rand(rotary_dim // 2, generator=generator)).tolist()
    config = transformers.Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=ORIGINAL,
                                     rope_scaling={"rope_type": "longrope", "short_factor": short, "long_factor": long},
                                     partial_rotary_factor=partial_rotary_factor, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     sliding_window=None)
    return save_random_model(transformers.Phi3ForCausalLM, config, folder)


def _greedy(path, prompt: list[int], num_tokens: int, max_model_len: int | None = None) -> list[int]:
    from ember.engine.sampling_params import SamplingParams
    from ember.llm import LLM

    llm = LLM(str(path), block_size=4, num_kv_blocks=64, max_model_len=max_model_len)
    return llm.generate([prompt], SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True))[0].outputs[0].token_ids


def test_longrope_config_reads_both_factor_sets_and_the_attention_factor(longrope_folder):
    scaling = config_from_hf(transformers.AutoConfig.from_pretrained(longrope_folder).to_dict()).rope_scaling
    assert scaling.kind == "longrope" and scaling.original_max_position_embeddings == ORIGINAL
    assert len(scaling.frequency_factors) == len(scaling.long_frequency_factors) == HEAD_DIM // 2
    assert scaling.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(ORIGINAL)))


@pytest.mark.parametrize("folder_fixture", ["longrope_folder", "partial_folder"])
def test_an_hf_longrope_model_matches_transformers_past_the_original_context(request, folder_fixture):
    folder = request.getfixturevalue(folder_fixture)
    reference = load_reference(folder)
    assert_prompt_logits_match(folder, reference, PROMPTS)
    assert _greedy(folder, PROMPTS[0], 30) == reference_greedy(reference, PROMPTS[0], 30)


def test_served_within_the_original_context_an_hf_longrope_model_matches_transformers_with_the_short_factors(longrope_folder):
    """vLLM's rule: --max-model-len at most the original context takes the short factors, which transformers uses for
    any sequence that short; the model's whole context (the default) takes the long ones, which it does not."""
    reference = load_reference(longrope_folder)
    short_prompts = [PROMPTS[0][:9], PROMPTS[1][: ORIGINAL - 1]]
    assert_prompt_logits_match(longrope_folder, reference, short_prompts, max_model_len=ORIGINAL)
    assert _greedy(longrope_folder, short_prompts[0], ORIGINAL - 9, ORIGINAL) == reference_greedy(reference, short_prompts[0], ORIGINAL - 9)
    with pytest.raises(AssertionError, match="max abs diff"):
        assert_prompt_logits_match(longrope_folder, reference, short_prompts)


def test_the_rotary_tables_cover_the_served_context_not_the_whole_model_context(longrope_folder):
    from ember.llm import LLM

    for max_model_len, rows in ((None, 64), (40, 40), (1000, 64)):
        llm = LLM(str(longrope_folder), block_size=4, num_kv_blocks=64, max_model_len=max_model_len)
        assert llm.engine.max_model_len == rows
        assert llm.engine.runner.model.model.layers[0].self_attn.rotary.cos.shape[0] == rows


def test_a_partial_rotation_reads_its_dims_and_an_odd_one_is_refused_by_name(partial_folder):
    config = config_from_hf(transformers.AutoConfig.from_pretrained(partial_folder).to_dict())
    assert (config.head_dim, config.rotary_dim) == (HEAD_DIM, 12)
    odd = dict(transformers.AutoConfig.from_pretrained(partial_folder).to_dict(), partial_rotary_factor=0.5625)  # 9 of 16
    with pytest.raises(ValueError, match="partial_rotary_factor 0.5625 rotates 9 of 16"):
        config_from_hf(odd)


def test_a_context_within_the_original_one_rotates_with_the_short_factors():
    from ember.config.model import RopeScaling
    from ember.layers.rotary import rope_inverse_frequencies, rotation_angles

    scaling = RopeScaling("longrope", original_max_position_embeddings=16, frequency_factors=(1.0, 2.0),
                          long_frequency_factors=(4.0, 8.0))
    plain = rope_inverse_frequencies(4, 10_000.0, None)
    assert torch.allclose(rotation_angles(4, 16, 10_000.0, scaling)[3], 3 * plain / torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert torch.allclose(rotation_angles(4, 17, 10_000.0, scaling)[3], 3 * plain / torch.tensor([4.0, 8.0], dtype=torch.float64))


def write_longrope_gguf(folder, path) -> None:
    """The HF Phi-3 in `folder` as llama.cpp's converter writes a LongRoPE model: fused q/k/v and gate/up, the factors as
    rope_factors_short / rope_factors_long tensors, the rotated dims, original context and attention factor as metadata."""
    config = transformers.AutoConfig.from_pretrained(folder)
    rope = config.rope_parameters

    def longrope(writer: GGUFWriter) -> None:
        writer.add_rope_dimension_count(int(HEAD_DIM * getattr(config, "partial_rotary_factor", 1.0)))
        writer.add_rope_scaling_orig_ctx_len(ORIGINAL)
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(4) / math.log(ORIGINAL)))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))

    write_gguf(folder, path, GGMLQuantizationType.F32, np.random.default_rng(0), architecture="phi3", extra=longrope)


@pytest.mark.parametrize("folder_fixture", ["longrope_folder", "partial_folder"])
def test_a_longrope_gguf_matches_transformers_past_the_original_context(request, tmp_path, folder_fixture):
    folder = request.getfixturevalue(folder_fixture)
    path = tmp_path / "phi3.gguf"
    write_longrope_gguf(folder, path)
    ours, theirs = read_gguf_config(GGUFFile.open(path)), config_from_hf(transformers.AutoConfig.from_pretrained(folder).to_dict())
    assert (ours.head_dim, ours.rotary_dim) == (theirs.head_dim, theirs.rotary_dim)
    assert ours.rope_scaling.kind == "longrope" and ours.rope_scaling.original_max_position_embeddings == ORIGINAL
    assert ours.rope_scaling.attention_factor == pytest.approx(theirs.rope_scaling.attention_factor)
    assert ours.rope_scaling.long_frequency_factors == pytest.approx(theirs.rope_scaling.long_frequency_factors)
    reference = load_reference(folder)
    assert_prompt_logits_match(path, reference, PROMPTS)
    assert _greedy(path, PROMPTS[0], 30) == reference_greedy(reference, PROMPTS[0], 30)


def test_a_gguf_with_one_longrope_factor_tensor_is_refused_by_name(tmp_path):
    path = tmp_path / "half.gguf"
    writer = GGUFWriter(str(path), "phi3")
    for key, value in (("block_count", 1), ("embedding_length", 16), ("attention.head_count", 2), ("feed_forward_length", 32)):
        writer.add_uint32(f"phi3.{key}", value)
    writer.add_tensor("rope_factors_long.weight", np.ones(4, dtype=np.float32))
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32), raw_dtype=GGMLQuantizationType.F32)
    finish_gguf(writer)
    with pytest.raises(ValueError, match="lacks rope_factors_short.weight"):
        read_gguf_config(GGUFFile.open(path))
