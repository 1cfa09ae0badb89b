"""The KV cache manager: block tables, prefix-cache hits, copy-on-write, and saying no.

Block size 4 and a handful of blocks throughout; every test asserts exact block ids.
"""

from __future__ import annotations

from ember.kv.cache_manager import BlockCopy, KVCacheManager
from ember.kv.hashing import hash_block, hash_blocks

BLOCK_SIZE = 4
PROMPT_10 = list(range(100, 110))  # two full blocks and a partial one


def manager(num_blocks: int = 6, enable_prefix_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching)


def table_ids(kv: KVCacheManager, seq_id: str) -> list[int]:
    return kv.block_table(seq_id).block_ids


def ref_counts(kv: KVCacheManager) -> list[int]:
    return [block.ref_count for block in kv.pool.blocks]


def free_ids(kv: KVCacheManager) -> list[int]:
    return kv.pool.free_queue.block_ids()


def admit(kv: KVCacheManager, seq_id: str, token_ids: list[int]) -> list[BlockCopy] | None:
    """Admit a whole prompt the way the scheduler does: prefix hit first, then the rest."""
    prefix = kv.find_cached_prefix(token_ids, len(token_ids) - 1)
    return kv.allocate_slots(seq_id, token_ids, prefix.num_tokens, len(token_ids) - prefix.num_tokens, prefix)


# -- chained hashes ----------------------------------------------------------------------------


def test_block_hashes_cover_full_blocks_only() -> None:
    hashes = hash_blocks(PROMPT_10, BLOCK_SIZE)

    assert len(hashes) == 2
    assert hashes[0] == hash_block(None, PROMPT_10[:4])
    assert hashes[1] == hash_block(hashes[0], PROMPT_10[4:8])


def test_a_different_earlier_block_changes_every_later_hash() -> None:
    changed = [999] + PROMPT_10[1:]

    original, altered = hash_blocks(PROMPT_10, BLOCK_SIZE), hash_blocks(changed, BLOCK_SIZE)

    assert original[0] != altered[0]
    assert original[1] != altered[1]  # same tokens 104..107, different parent


def test_extra_keys_change_the_hash() -> None:
    plain = hash_blocks(PROMPT_10, BLOCK_SIZE)

    assert hash_blocks(PROMPT_10, BLOCK_SIZE, extra_keys=("adapter-1",)) != plain
    assert hash_blocks(PROMPT_10, BLOCK_SIZE, extra_keys=("adapter-2",)) != hash_blocks(
        PROMPT_10, BLOCK_SIZE, extra_keys=("adapter-1",)
    )
    assert hash_blocks(PROMPT_10, BLOCK_SIZE, extra_keys=()) == plain


# -- allocation on demand ----------------------------------------------------------------------


def test_a_prompt_gets_just_enough_blocks_from_the_front_of_the_free_list() -> None:
    kv = manager()

    copies = kv.allocate_slots("a", PROMPT_10, 0, 10)

    assert copies == []
    assert table_ids(kv, "a") == [0, 1, 2]
    assert free_ids(kv) == [3, 4, 5]
    assert ref_counts(kv) == [1, 1, 1, 0, 0, 0]


def test_decoding_takes_a_new_block_only_when_the_last_one_is_full() -> None:
    kv = manager()
    tokens = list(PROMPT_10)
    kv.allocate_slots("a", tokens, 0, 10)

    tokens.append(1)  # slot 10 lies in block 2
    kv.allocate_slots("a", tokens, 10, 1)
    assert table_ids(kv, "a") == [0, 1, 2]

    tokens.append(2)  # slot 11 lies in block 2
    kv.allocate_slots("a", tokens, 11, 1)
    assert table_ids(kv, "a") == [0, 1, 2]

    tokens.append(3)  # slot 12 starts a new block
    kv.allocate_slots("a", tokens, 12, 1)
    assert table_ids(kv, "a") == [0, 1, 2, 3]
    assert free_ids(kv) == [4, 5]


def test_a_chunked_prompt_grows_its_table_chunk_by_chunk() -> None:
    kv = manager()

    kv.allocate_slots("a", PROMPT_10, 0, 3)
    assert table_ids(kv, "a") == [0]
    kv.allocate_slots("a", PROMPT_10, 3, 3)
    assert table_ids(kv, "a") == [0, 1]
    kv.allocate_slots("a", PROMPT_10, 6, 4)
    assert table_ids(kv, "a") == [0, 1, 2]


def test_allocation_returns_none_and_changes_nothing_when_the_pool_is_short() -> None:
    kv = manager(num_blocks=3)
    kv.allocate_slots("a", PROMPT_10[:8], 0, 8)

    copies = kv.allocate_slots("b", PROMPT_10, 0, 10)

    assert copies is None
    assert table_ids(kv, "a") == [0, 1]
    assert free_ids(kv) == [2]
    assert ref_counts(kv) == [1, 1, 0]
    assert kv.find_cached_prefix(PROMPT_10, 9).num_tokens == 8  # a's blocks still cached
    kv.free("b")  # b holds nothing: freeing it is a no-op
    assert free_ids(kv) == [2]


def test_a_growing_sequence_that_does_not_fit_keeps_its_blocks() -> None:
    kv = manager(num_blocks=2)
    tokens = PROMPT_10[:8]
    kv.allocate_slots("a", tokens, 0, 8)

    assert kv.allocate_slots("a", tokens + [1], 8, 1) is None

    assert table_ids(kv, "a") == [0, 1]
    assert ref_counts(kv) == [1, 1]


# -- freeing -----------------------------------------------------------------------------------


def test_free_releases_the_last_block_first_so_the_tail_is_evicted_first() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    kv.free("a")

    assert free_ids(kv) == [3, 4, 5, 2, 1, 0]
    assert kv.num_free_blocks == 6


def test_freeing_a_sequence_twice_is_harmless() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)
    kv.free("a")

    kv.free("a")

    assert free_ids(kv) == [3, 4, 5, 2, 1, 0]
    assert ref_counts(kv) == [0] * 6


def test_the_pool_is_full_again_after_every_sequence_is_freed() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)
    admit(kv, "b", PROMPT_10 + [7])
    kv.fork("b", "c")
    kv.allocate_slots("c", PROMPT_10 + [7, 8], 11, 1)

    for seq_id in ("a", "b", "c"):
        kv.free(seq_id)

    assert kv.num_free_blocks == 6
    assert kv.usage == 0.0
    assert ref_counts(kv) == [0] * 6
    assert sorted(free_ids(kv)) == [0, 1, 2, 3, 4, 5]


# -- prefix cache ------------------------------------------------------------------------------


def test_full_blocks_are_found_again_and_the_partial_one_is_not() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    prefix = kv.find_cached_prefix(PROMPT_10, 10)

    assert [block.block_id for block in prefix.blocks] == [0, 1]
    assert prefix.num_tokens == 8
    assert list(prefix.block_hashes) == hash_blocks(PROMPT_10, BLOCK_SIZE)


def test_the_lookup_stops_at_max_tokens() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    assert kv.find_cached_prefix(PROMPT_10, 7).num_tokens == 4
    assert kv.find_cached_prefix(PROMPT_10, 3).num_tokens == 0


def test_a_different_first_block_misses_even_when_the_second_block_matches() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    prefix = kv.find_cached_prefix([999] + PROMPT_10[1:], 10)

    assert prefix.num_tokens == 0


def test_a_different_second_block_hits_only_the_first() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    prefix = kv.find_cached_prefix(PROMPT_10[:4] + [999] + PROMPT_10[5:], 10)

    assert [block.block_id for block in prefix.blocks] == [0]


def test_extra_keys_keep_prefixes_apart() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10, extra_keys=("adapter-1",))

    assert kv.find_cached_prefix(PROMPT_10, 10).num_tokens == 0
    assert kv.find_cached_prefix(PROMPT_10, 10, extra_keys=("adapter-2",)).num_tokens == 0
    assert kv.find_cached_prefix(PROMPT_10, 10, extra_keys=("adapter-1",)).num_tokens == 8


def test_a_block_is_hashed_when_decoding_fills_it() -> None:
    kv = manager()
    tokens = PROMPT_10[:7]
    kv.allocate_slots("a", tokens, 0, 7)
    assert kv.find_cached_prefix(PROMPT_10, 10).num_tokens == 4

    tokens.append(PROMPT_10[7])
    kv.allocate_slots("a", tokens, 7, 1)

    assert [block.block_id for block in kv.find_cached_prefix(PROMPT_10, 10).blocks] == [0, 1]


def test_a_hit_shares_held_blocks_and_counts_the_prefix_statistics() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    copies = admit(kv, "b", PROMPT_10)

    assert copies == []
    assert table_ids(kv, "b") == [0, 1, 3]
    assert ref_counts(kv) == [2, 2, 1, 1, 0, 0]
    assert free_ids(kv) == [4, 5]
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits) == (10, 8)


def test_a_hit_revives_free_cached_blocks_out_of_the_middle_of_the_free_list() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 10)
    kv.free("a")
    assert free_ids(kv) == [3, 4, 5, 2, 1, 0]

    admit(kv, "b", PROMPT_10)

    assert table_ids(kv, "b") == [0, 1, 3]
    assert free_ids(kv) == [4, 5, 2]
    assert ref_counts(kv) == [1, 1, 0, 1, 0, 0]


def test_cached_free_blocks_are_reused_least_recently_freed_first() -> None:
    kv = manager(num_blocks=4)
    kv.allocate_slots("a", PROMPT_10[:8], 0, 8)  # blocks 0, 1
    kv.allocate_slots("b", PROMPT_10[:4] + [7, 7, 7, 7], 0, 8)  # blocks 2, 3; block 2 not cached
    kv.free("b")
    kv.free("a")
    assert free_ids(kv) == [3, 2, 1, 0]

    kv.allocate_slots("c", [5] * 12, 0, 12)

    assert table_ids(kv, "c") == [3, 2, 1]
    assert [block.block_id for block in kv.find_cached_prefix(PROMPT_10, 10).blocks] == [0]
    assert kv.find_cached_prefix(PROMPT_10[:4] + [7, 7, 7, 7], 8).num_tokens == 4


def test_reviving_free_cached_blocks_counts_against_the_free_blocks() -> None:
    kv = manager(num_blocks=3)
    kv.allocate_slots("a", PROMPT_10[:8], 0, 8)
    kv.free("a")
    kv.allocate_slots("x", [5], 0, 1)  # takes block 2, leaving 1 and 0 free and cached
    assert free_ids(kv) == [1, 0]

    assert admit(kv, "b", PROMPT_10) is None  # needs 0 and 1 back plus one more block

    assert free_ids(kv) == [1, 0]
    assert ref_counts(kv) == [0, 0, 1]
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits) == (0, 0)


def test_with_prefix_caching_off_nothing_is_hashed_or_found() -> None:
    kv = manager(enable_prefix_caching=False)
    kv.allocate_slots("a", PROMPT_10, 0, 10)

    assert kv.find_cached_prefix(PROMPT_10, 10).num_tokens == 0
    assert kv.pool.cached == {}


# -- fork and copy-on-write --------------------------------------------------------------------


def test_a_fork_shares_every_block_of_its_parent() -> None:
    kv = manager()
    kv.allocate_slots("a", PROMPT_10, 0, 6)

    kv.fork("a", "b")

    assert table_ids(kv, "b") == [0, 1]
    assert ref_counts(kv) == [2, 2, 0, 0, 0, 0]
    assert free_ids(kv) == [2, 3, 4, 5]


def test_the_first_writer_into_a_shared_partial_block_copies_it_and_the_last_writes_in_place() -> None:
    prompt = PROMPT_10[:7]
    kv = manager()
    kv.allocate_slots("a", prompt, 0, 6)  # block 1 holds tokens 4, 5 and is partial
    kv.fork("a", "b")
    kv.fork("a", "c")

    assert kv.allocate_slots("a", prompt, 6, 1) == [BlockCopy(source=1, destination=2)]
    assert kv.allocate_slots("b", prompt, 6, 1) == [BlockCopy(source=1, destination=3)]
    assert kv.allocate_slots("c", prompt, 6, 1) == []

    assert table_ids(kv, "a") == [0, 2]
    assert table_ids(kv, "b") == [0, 3]
    assert table_ids(kv, "c") == [0, 1]
    assert ref_counts(kv) == [3, 1, 1, 1, 0, 0]


def test_a_fork_at_a_block_boundary_needs_no_copy() -> None:
    prompt = PROMPT_10[:9]
    kv = manager()
    kv.allocate_slots("a", prompt, 0, 8)
    kv.fork("a", "b")

    assert kv.allocate_slots("a", prompt, 8, 1) == []
    assert kv.allocate_slots("b", prompt, 8, 1) == []

    assert table_ids(kv, "a") == [0, 1, 2]
    assert table_ids(kv, "b") == [0, 1, 3]
    assert ref_counts(kv) == [2, 2, 1, 1, 0, 0]


def test_copy_on_write_returns_none_and_changes_nothing_without_a_free_block() -> None:
    prompt = PROMPT_10[:7]
    kv = manager(num_blocks=2)
    kv.allocate_slots("a", prompt, 0, 6)
    kv.fork("a", "b")

    assert kv.allocate_slots("b", prompt, 6, 1) is None

    assert table_ids(kv, "b") == [0, 1]
    assert ref_counts(kv) == [2, 2]


def test_forked_sequences_cache_their_own_diverging_blocks() -> None:
    kv = manager()
    prompt = PROMPT_10[:6]
    kv.allocate_slots("a", prompt, 0, 6)
    kv.fork("a", "b")
    a_tokens, b_tokens = prompt + [1, 1], prompt + [2, 2]

    kv.allocate_slots("a", a_tokens, 6, 2)
    kv.allocate_slots("b", b_tokens, 6, 2)

    assert [block.block_id for block in kv.find_cached_prefix(a_tokens, 8).blocks] == [0, 2]
    assert [block.block_id for block in kv.find_cached_prefix(b_tokens, 8).blocks] == [0, 1]


# -- speculative slots -------------------------------------------------------------------------


def test_drafted_slots_are_never_hashed_and_trim_gives_their_blocks_back() -> None:
    kv = manager(num_blocks=8)
    tokens = PROMPT_10 + [110]  # 11 tokens, 10 computed; the last one plus 6 drafted tokens are scored
    admit(kv, "a", PROMPT_10)
    kv.allocate_slots("a", tokens, 10, 1 + 6)

    assert table_ids(kv, "a") == [0, 1, 2, 3, 4]  # slots for 17 tokens
    assert len(kv.block_table("a").block_hashes) == 2  # block 2 holds drafted slots: not registered
    kv.trim("a", 12)  # the last token and one drafted token were kept

    assert table_ids(kv, "a") == [0, 1, 2]
    assert free_ids(kv) == [5, 6, 7, 4, 3]  # given back last block first
    assert len(kv.pool.cached) == 2


def test_a_block_full_of_kept_tokens_is_registered_at_the_next_allocation() -> None:
    kv = manager(num_blocks=8)
    admit(kv, "a", PROMPT_10)
    kv.allocate_slots("a", PROMPT_10 + [110], 10, 4)  # 3 drafted tokens after token 110
    kv.trim("a", 13)
    tokens = PROMPT_10 + [110, 111, 112, 113]  # two drafts kept, then token 113
    kv.allocate_slots("a", tokens, 13, 1)

    assert len(kv.block_table("a").block_hashes) == 3
    assert kv.find_cached_prefix(tokens, len(tokens)).num_tokens == 12
