"""ember.bench: deterministic workloads, runners for ember and its peers, roofline, reports.

Nothing in the library imports this package; `ember bench ...` (ember/bench/cli.py) drives it.
"""
