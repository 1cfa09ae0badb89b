"""ember.layers."""
