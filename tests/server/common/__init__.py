"""Tests of ember.server.common."""
