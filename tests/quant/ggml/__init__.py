"""Tests of ember.quant.ggml."""
