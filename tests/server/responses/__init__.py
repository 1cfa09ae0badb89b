"""Tests of ember.server.responses."""
