"""ember.server."""
