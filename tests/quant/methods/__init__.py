"""Tests of ember.quant.methods."""
