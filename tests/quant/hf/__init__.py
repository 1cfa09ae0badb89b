"""Tests of ember.quant.hf."""
