"""Tests of ember.server."""
