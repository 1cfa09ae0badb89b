"""ember.bench."""
