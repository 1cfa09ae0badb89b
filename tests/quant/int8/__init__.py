"""Tests of ember.quant.int8."""
