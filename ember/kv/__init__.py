"""ember.kv: the paged KV cache's bookkeeping (block pool, cache manager, prefix cache, KV specs, planner).

See README.md beside this file.
"""
