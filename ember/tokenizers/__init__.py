"""ember.tokenizers."""
