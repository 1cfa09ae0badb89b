"""Property: with any mix of windowed and full layer groups, no block leaks and windows stay small.

Random admissions (with prefix hits), chunked advances, forks and frees over one manager; after
every operation each block's ref count equals the tables holding it, the free list holds exactly
the unreferenced blocks, and no windowed table keeps a block wholly behind its window.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ember.kv.cache_manager import KVCacheManager

BLOCK_SIZE = 2
NUM_BLOCKS = 40

operations = st.lists(
    st.tuples(st.sampled_from(["admit", "advance", "fork", "free"]), st.integers(0, 3), st.integers(1, 6)),
    max_size=40,
)


def _check(kv: KVCacheManager, computed: dict[str, int]) -> None:
    """`computed[seq]`: tokens computed when the sequence last allocated (its window's reference point)."""
    holders: Counter[int] = Counter()
    for group, window in enumerate(kv.group_windows):
        for seq_id, table in kv.group_tables[group].items():
            holders.update(block.block_id for block in table.blocks if block is not kv.null_block)
            if window is not None:
                first = max(0, computed[seq_id] - window + 1) // BLOCK_SIZE
                assert all(block is kv.null_block for block in table.blocks[:first])
    for block in kv.pool.blocks:
        assert block.ref_count == holders[block.block_id]
    assert kv.num_free_blocks == sum(1 for block in kv.pool.blocks if block.ref_count == 0)


@settings(max_examples=60, deadline=None)
@given(windows=st.sampled_from([(3,), (None, 3), (4, None, 2)]), ops=operations)
def test_no_block_leaks_and_windows_stay_bounded(windows, ops):
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, group_windows=windows)
    tokens: dict[str, list[int]] = {}
    computed: dict[str, int] = {}  # tokens in the cache once the step allocated for runs
    before: dict[str, int] = {}  # tokens computed when the sequence last allocated
    for step, (kind, which, count) in enumerate(ops):
        live = sorted(tokens)
        if kind == "admit":
            seq_id = f"s{step}"
            prompt = [which] * 3 + list(range(count * 2))  # shared starts give prefix hits
            prefix = kv.find_cached_prefix(prompt, len(prompt) - 1)
            if kv.allocate_slots(seq_id, prompt, prefix.num_tokens, len(prompt) - prefix.num_tokens, prefix) is not None:
                tokens[seq_id], computed[seq_id], before[seq_id] = prompt, len(prompt), prefix.num_tokens
        elif live and kind == "advance":
            seq_id = live[which % len(live)]
            tokens[seq_id].extend([step] * count)
            if kv.allocate_slots(seq_id, tokens[seq_id], computed[seq_id], count) is not None:
                before[seq_id] = computed[seq_id]
                computed[seq_id] += count
            else:
                del tokens[seq_id][computed[seq_id] :]
        elif live and kind == "fork":
            parent = live[which % len(live)]
            child = f"{parent}/{step}"
            kv.fork(parent, child)
            tokens[child], computed[child], before[child] = list(tokens[parent]), computed[parent], before[parent]
        elif live and kind == "free":
            seq_id = live[which % len(live)]
            kv.free(seq_id)
            del tokens[seq_id], computed[seq_id], before[seq_id]
        _check(kv, before)
    for seq_id in list(tokens):
        kv.free(seq_id)
    assert kv.num_free_blocks == NUM_BLOCKS
