"""The radix prefix cache with block size 4: exact block ids, copies and eviction order."""

from __future__ import annotations

from ember.kv.cache_manager import BlockCopy, KVCacheManager

A = list(range(10))  # blocks 0 and 1 full, block 2 holding tokens 8 and 9
B = list(range(9)) + [99, 98, 97]  # leaves A after token 8, inside A's third block


def _radix(num_blocks: int = 8, **options) -> KVCacheManager:
    return KVCacheManager(num_blocks, 4, prefix_cache="radix", **options)


def _run(kv: KVCacheManager, seq_id: str, prompt: list[int], extra_keys: tuple = ()) -> list[BlockCopy] | None:
    """Admit `prompt` with whatever the cache has, computing all but nothing past it."""
    prefix = kv.find_cached_prefix(prompt, len(prompt) - 1, extra_keys)
    return kv.allocate_slots(seq_id, prompt, prefix.num_tokens, len(prompt) - prefix.num_tokens, prefix, extra_keys)


def test_a_prompt_leaving_a_cached_one_inside_a_block_reuses_that_blocks_first_tokens_through_a_copy():
    kv = _radix()
    _run(kv, "a", A)
    kv.free("a", A)
    prefix = kv.find_cached_prefix(B, len(B) - 1)
    assert prefix.num_tokens == 9
    assert [block.block_id for block in prefix.blocks] == [0, 1, 2]
    copies = kv.allocate_slots("b", B, 9, 3, prefix)
    assert copies == [BlockCopy(source=2, destination=3)]
    assert kv.block_ids("b") == ([0, 1, 3],)
    assert kv.block_table("b").copy_sources[2].block_id == 2  # held until b gives back its copy
    assert kv.prefix_stats.hits == 9


def test_the_hash_cache_serves_only_whole_blocks_of_the_same_prompts():
    kv = KVCacheManager(8, 4, prefix_cache="hash")
    _run(kv, "a", A)
    kv.free("a")
    assert kv.find_cached_prefix(B, len(B) - 1).num_tokens == 8


def test_freed_sequences_go_to_the_lru_leaf_first_the_copy_before_its_source():
    kv = _radix()
    _run(kv, "a", A)
    kv.free("a", A)
    assert kv.pool.free_queue.block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    _run(kv, "b", B)
    kv.free("b", B)
    assert kv.pool.free_queue.block_ids() == [4, 5, 6, 7, 3, 2, 1, 0]


def test_eviction_takes_the_least_recently_used_leaves_and_keeps_their_parents():
    kv = _radix()
    _run(kv, "a", A)
    kv.free("a", A)
    _run(kv, "b", B)
    kv.free("b", B)
    unrelated = [50 + i for i in range(17)]  # five blocks: the four never used, then b's leaf (block 3)
    assert kv.allocate_slots("c", unrelated, 0, 17) == []
    assert kv.block_ids("c") == ([4, 5, 6, 7, 3],)
    assert kv.find_cached_prefix(B, len(B) - 1).num_tokens == 9  # b's own tokens went with block 3
    assert kv.find_cached_prefix(A, len(A) - 1).num_tokens == 9  # a's leaf (block 2) is still there
    assert kv.allocate_slots("c", unrelated + [0] * 4, 17, 4) == []  # one more block: a's leaf, block 2
    assert kv.block_ids("c") == ([4, 5, 6, 7, 3, 2],)
    assert kv.find_cached_prefix(A, len(A) - 1).num_tokens == 8


def test_blocks_a_running_sequence_holds_are_never_evicted():
    kv = _radix(num_blocks=4)
    _run(kv, "a", A)  # holds blocks 0, 1, 2
    assert _run(kv, "c", [70, 71, 72, 73, 74]) is None  # two blocks wanted, one free: no
    assert kv.block_ids("a") == ([0, 1, 2],)
    kv.free("a", A)
    assert kv.find_cached_prefix(B, len(B) - 1).num_tokens == 9


def test_a_block_the_step_has_yet_to_compute_is_shared_whole_but_never_copied():
    kv = _radix()
    _run(kv, "a", A[:8] + [0, 0])  # blocks 0 and 1 registered, computed only once the step runs
    assert kv.find_cached_prefix(A[:6] + [7, 7], 7).num_tokens == 4  # not 6: block 1 is pending
    assert kv.find_cached_prefix(A[:8] + [5, 5], 9).num_tokens == 8  # a whole pending block is shared, as with hashes
    kv.allocate_slots("a", A[:8] + [0, 0, 1], 10, 1)  # the next step: a's first step has run
    assert kv.find_cached_prefix(A[:6] + [7, 7], 7).num_tokens == 6


def test_adapters_and_cache_salts_partition_the_tree():
    kv = _radix()
    _run(kv, "a", A, ("alice",))
    kv.free("a", A, ("alice",))
    assert kv.find_cached_prefix(B, len(B) - 1).num_tokens == 0
    assert kv.find_cached_prefix(B, len(B) - 1, ("bob",)).num_tokens == 0
    assert kv.find_cached_prefix(B, len(B) - 1, ("alice",)).num_tokens == 9


def test_a_sliding_window_group_needs_only_the_blocks_its_window_reaches():
    kv = _radix(num_blocks=12, group_windows=(None, 4))
    _run(kv, "a", A)
    kv.free("a", A)
    prefix = kv.find_cached_prefix(B, len(B) - 1)
    assert prefix.num_tokens == 9
    assert [block.block_id for block in prefix.blocks] == [0, 1, 2]
    # the window of token 9 reaches back to token 6: the windowed group (blocks 3, 4, 5) needs only its blocks 1 and 2
    assert [block.block_id for block in prefix.other_groups[0]] == [-1, 4, 5]
    kv.allocate_slots("b", B, 9, 3, prefix)
    assert kv.block_ids("b") == ([0, 1, 6], [-1, 4, 7])  # each group copies its partial block
