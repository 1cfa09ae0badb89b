"""The KV manager with windowed layer groups: blocks behind the window go back to the pool."""

from __future__ import annotations

from ember.kv.cache_manager import NULL_BLOCK_ID, KVCacheManager


def _decode(kv: KVCacheManager, seq_id: str, tokens: list[int], num_steps: int, bound: dict[int, int]) -> None:
    """Prefill `tokens`, then decode one token a step, checking each group's held blocks stay in `bound`."""
    assert kv.allocate_slots(seq_id, tokens, 0, len(tokens)) is not None
    for _ in range(num_steps):
        computed = len(tokens)
        tokens.append(computed % 7)
        assert kv.allocate_slots(seq_id, tokens, computed, 1) is not None
        for group, limit in bound.items():
            assert kv.block_tables(seq_id)[group].num_held_blocks <= limit


def test_a_windowed_group_holds_at_most_window_plus_one_block_while_decoding_ten_windows():
    kv = KVCacheManager(num_blocks=8, block_size=2, group_windows=(4,))
    _decode(kv, "a", [1, 2, 3], num_steps=40, bound={0: 4 // 2 + 1})
    table = kv.block_table("a")
    assert len(table.blocks) == 22  # positions 0..42 in 2-token blocks
    assert table.block_ids[:19] == [NULL_BLOCK_ID] * 19
    kv.free("a")
    assert kv.num_free_blocks == 8


def test_a_hybrid_model_keeps_full_kv_only_in_its_global_group():
    kv = KVCacheManager(num_blocks=40, block_size=2, group_windows=(None, 4))
    _decode(kv, "a", [1, 2, 3], num_steps=30, bound={1: 3})
    full, windowed = kv.block_tables("a")
    assert full.num_held_blocks == 17  # 33 tokens
    assert windowed.num_held_blocks <= 3
    assert kv.num_free_blocks == 40 - full.num_held_blocks - windowed.num_held_blocks
    kv.free("a")
    assert kv.num_free_blocks == 40


def test_given_back_blocks_of_a_long_prefill_are_returned_on_the_next_step():
    kv = KVCacheManager(num_blocks=10, block_size=2, group_windows=(3,))
    tokens = list(range(12))
    assert kv.allocate_slots("a", tokens, 0, 12) == []
    assert kv.block_table("a").block_ids == [0, 1, 2, 3, 4, 5]
    tokens.append(12)
    assert kv.allocate_slots("a", tokens, 12, 1) == []
    # The token at 12 sees 10..12: blocks 0-4 (positions 0-9) are given back, block 6 is new.
    assert kv.block_table("a").block_ids == [NULL_BLOCK_ID] * 5 + [5, 6]
    assert kv.pool.free_queue.block_ids()[-5:] == [0, 1, 2, 3, 4]


def test_a_prefix_hit_needs_only_the_blocks_inside_the_window():
    kv = KVCacheManager(num_blocks=10, block_size=2, group_windows=(3,))
    tokens = list(range(9))
    assert kv.allocate_slots("a", tokens, 0, 9) == []
    kv.free("a")
    prefix = kv.find_cached_prefix(tokens, max_tokens=8)
    # 8 tokens hit: the token at 8 sees 6..8, so only block 3 (positions 6, 7) is needed.
    assert prefix.num_tokens == 8
    assert [block.block_id for block in prefix.blocks] == [NULL_BLOCK_ID] * 3 + [3]
    assert kv.allocate_slots("b", tokens, 8, 1, prefix) == []
    assert kv.block_table("b").block_ids == [NULL_BLOCK_ID] * 3 + [3, 5]
    assert kv.prefix_stats.hits == 8


def test_a_prefix_whose_window_blocks_were_evicted_shrinks_to_what_is_still_there():
    kv = KVCacheManager(num_blocks=10, block_size=2, group_windows=(3, None))
    tokens = list(range(8))
    assert kv.allocate_slots("a", tokens, 0, 8) == []
    assert [table.block_ids for table in kv.block_tables("a")] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    kv.free("a")
    kv.pool.take_free(4)  # evicts 8, 9, then the windowed group's blocks 3 and 2
    prefix = kv.find_cached_prefix(tokens, max_tokens=7)
    # 6 tokens would need windowed block 2 (positions 4, 5); 4 tokens need only block 1.
    assert prefix.num_tokens == 4
    assert [block.block_id for block in prefix.blocks] == [NULL_BLOCK_ID, 1]
    assert [[block.block_id for block in group] for group in prefix.other_groups] == [[4, 5]]
