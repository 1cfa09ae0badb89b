"""ember.engine."""
