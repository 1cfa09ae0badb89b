"""Tests of ember.quant.codes."""
