"""ember.eval: model quality measurements."""
