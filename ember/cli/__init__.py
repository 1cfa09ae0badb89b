"""ember.cli."""
