"""ember.kv."""
