"""The bandwidth probe compiles and measures something positive; bytes per decode step follow the
checkpoint: every weight once (an untied embedding table one row), plus the KV cache at its context."""

from __future__ import annotations

import shutil

import pytest

from ember.bench import roofline
from tests.model_factory import TINY_SHAPE, save_tiny_model


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on this machine")
def test_c_probe_compiles_and_returns_a_positive_bandwidth():
    result = roofline.measure_bandwidth(array_bytes=32 << 20, passes=2)
    assert result.method.startswith("C probe")
    assert result.gb_per_s > 0 and result.threads >= 1


def test_without_a_compiler_numpy_measures_and_says_so():
    result = roofline.measure_bandwidth(array_bytes=8 << 20, passes=2, compiler="/nonexistent/cc")
    assert result.method.startswith("numpy") and result.gb_per_s > 0


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[bool, object]:
    """The same tiny Llama, with its embedding tied to the LM head and untied."""
    return {tied: save_tiny_model("llama", tmp_path_factory.mktemp(f"tied-{tied}"), tie_word_embeddings=tied) for tied in (True, False)}


def test_a_decode_step_reads_every_weight_once_and_a_tied_embedding_once_as_the_lm_head(tiny_models):
    elements = roofline.tensor_elements(tiny_models[True])
    step = roofline.decode_bytes(tiny_models[True], "float32")
    assert step.tied_embeddings and "lm_head.weight" not in elements
    assert step.weight_bytes == 4 * sum(elements.values())


def test_an_untied_embedding_table_counts_one_row_and_the_lm_head_whole(tiny_models):
    elements = roofline.tensor_elements(tiny_models[False])
    table = elements["model.embed_tokens.weight"]
    step = roofline.decode_bytes(tiny_models[False], "bfloat16")
    assert not step.tied_embeddings and "lm_head.weight" in elements
    assert step.weight_bytes == 2 * (sum(elements.values()) - table + TINY_SHAPE["hidden_size"])


def test_kv_bytes_read_grow_with_the_context_keys_and_values_of_every_layer(tiny_models):
    shape = TINY_SHAPE
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * 4
    empty = roofline.decode_bytes(tiny_models[True], "float32", context_len=0)
    step = roofline.decode_bytes(tiny_models[True], "float32", context_len=192)
    assert step.kv_bytes_per_token == per_token
    assert (empty.kv_bytes, step.kv_bytes) == (0, 192 * per_token)
    assert step.total == step.weight_bytes + 192 * per_token == roofline.bytes_per_token(tiny_models[True], "float32", 192)
