"""The W8A8 product timings of `ember bench quant`: one row per layer and row count, every path timed."""

from __future__ import annotations

from ember.bench.w8a8_kernels import bench_w8a8_kernels, layer_shapes
from ember.quant.int8.w8a8_kernels import load_w8a8_kernels
from tests.model_factory import save_tiny_model


def test_each_layer_and_row_count_gets_a_row_with_every_path_timed(tmp_path):
    shapes = layer_shapes(str(save_tiny_model("llama", tmp_path)))
    assert shapes == {"qkv": (64, 64 + 2 * 32), "o": (64, 64), "gate_up": (64, 256), "down": (128, 64)}
    rows = bench_w8a8_kernels({"down": shapes["down"]}, rows=(1, 9), repeats=1)
    assert [(r["layer"], r["rows"], r["in"], r["out"]) for r in rows] == [("down", 1, 128, 64), ("down", 9, 128, 64)]
    has_kernel = load_w8a8_kernels() is not None
    assert all((r["compiled_us"] is not None) == has_kernel and min(r["torch_us"], r["int_mm_us"], r["float32_us"]) > 0 for r in rows)
