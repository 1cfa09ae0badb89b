"""Tests of ember.server.openai."""
