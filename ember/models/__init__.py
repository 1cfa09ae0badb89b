"""ember.models: one file per model family, and the loaders from a checkpoint path to a ready model.

See README.md beside this file.
"""
