"""The bandwidth probe compiles and measures something positive; bytes per token follow the weights."""

from __future__ import annotations

import shutil

import pytest

from ember.bench import roofline


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on this machine")
def test_c_probe_compiles_and_returns_a_positive_bandwidth():
    result = roofline.measure_bandwidth(array_bytes=32 << 20, passes=2)
    assert result.method.startswith("C probe")
    assert result.gb_per_s > 0 and result.threads >= 1


def test_without_a_compiler_numpy_measures_and_says_so():
    result = roofline.measure_bandwidth(array_bytes=8 << 20, passes=2, compiler="/nonexistent/cc")
    assert result.method.startswith("numpy") and result.gb_per_s > 0


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer():
    assert roofline.kv_bytes_per_token(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float32") == 2 * 30 * 3 * 64 * 4


def test_bytes_per_token_scales_with_the_dtype(monkeypatch, tmp_path):
    monkeypatch.setattr(roofline, "weight_elements", lambda path: 1000)
    assert roofline.bytes_per_token(tmp_path, "float32") == 4000
    assert roofline.bytes_per_token(tmp_path, "bfloat16", kv_bytes_per_token=10, context_len=5) == 2050
