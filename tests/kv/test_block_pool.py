"""The block pool: free list order, reference counts, cached-but-free blocks, eviction.

Every test uses a pool of four or five blocks and asserts exact block ids, so a change in
eviction order shows up as a precise diff.
"""

from __future__ import annotations

import pytest

from ember.kv.block_pool import BlockPool, FreeBlockQueue, KVBlock

HASH_A = b"hash-a"
HASH_B = b"hash-b"


def ids(blocks: list[KVBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def ref_counts(pool: BlockPool) -> list[int]:
    return [block.ref_count for block in pool.blocks]


# -- the free queue ---------------------------------------------------------------------------


def test_free_queue_pops_in_the_order_blocks_were_appended() -> None:
    blocks = [KVBlock(block_id=i) for i in range(4)]
    queue = FreeBlockQueue(blocks)

    assert queue.popleft().block_id == 0
    assert queue.popleft().block_id == 1
    assert queue.block_ids() == [2, 3]
    assert queue.num_free == 2


@pytest.mark.parametrize(("removed", "left"), [(0, [1, 2, 3]), (2, [0, 1, 3]), (3, [0, 1, 2])])
def test_free_queue_removes_any_block_and_keeps_the_others_in_order(removed: int, left: list[int]) -> None:
    blocks = [KVBlock(block_id=i) for i in range(4)]
    queue = FreeBlockQueue(blocks)

    queue.remove(blocks[removed])

    assert queue.block_ids() == left
    assert queue.num_free == 3
    assert blocks[removed].prev_free is None and blocks[removed].next_free is None


def test_free_queue_appends_a_removed_block_at_the_tail() -> None:
    blocks = [KVBlock(block_id=i) for i in range(3)]
    queue = FreeBlockQueue(blocks)

    queue.remove(blocks[0])
    queue.append(blocks[0])

    assert queue.block_ids() == [1, 2, 0]


def test_popping_an_empty_free_queue_raises() -> None:
    queue = FreeBlockQueue([KVBlock(block_id=0)])
    queue.popleft()

    with pytest.raises(RuntimeError, match="no free KV block"):
        queue.popleft()
    assert queue.num_free == 0


# -- taking and releasing ---------------------------------------------------------------------


def test_a_new_pool_has_every_block_free_in_id_order() -> None:
    pool = BlockPool(4)

    assert pool.num_blocks == 4
    assert pool.num_free_blocks == 4
    assert pool.free_queue.block_ids() == [0, 1, 2, 3]
    assert ref_counts(pool) == [0, 0, 0, 0]
    assert pool.usage == 0.0


def test_a_pool_without_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)


def test_take_free_hands_out_blocks_from_the_front_with_one_reference() -> None:
    pool = BlockPool(4)

    taken = pool.take_free(2)

    assert ids(taken) == [0, 1]
    assert ref_counts(pool) == [1, 1, 0, 0]
    assert pool.free_queue.block_ids() == [2, 3]
    assert pool.usage == 0.5


def test_take_free_beyond_the_free_count_raises_and_takes_nothing() -> None:
    pool = BlockPool(4)
    pool.take_free(3)

    with pytest.raises(RuntimeError, match="asked for 2 blocks with 1 free"):
        pool.take_free(2)
    assert pool.free_queue.block_ids() == [3]
    assert ref_counts(pool) == [1, 1, 1, 0]


def test_released_blocks_join_the_tail_in_release_order() -> None:
    pool = BlockPool(4)
    taken = pool.take_free(3)

    pool.release([taken[1]])
    pool.release([taken[0]])

    assert pool.free_queue.block_ids() == [3, 1, 0]
    assert ref_counts(pool) == [0, 0, 1, 0]


def test_a_shared_block_is_freed_only_when_its_last_holder_releases_it() -> None:
    pool = BlockPool(4)
    (block,) = pool.take_free(1)
    pool.share([block])

    pool.release([block])
    assert block.ref_count == 1
    assert pool.free_queue.block_ids() == [1, 2, 3]

    pool.release([block])
    assert block.ref_count == 0
    assert pool.free_queue.block_ids() == [1, 2, 3, 0]


def test_releasing_a_block_more_often_than_it_was_taken_raises() -> None:
    pool = BlockPool(4)
    (block,) = pool.take_free(1)
    pool.release([block])

    with pytest.raises(RuntimeError, match="block 0 released more often"):
        pool.release([block])
    assert pool.free_queue.block_ids() == [1, 2, 3, 0]


def test_share_revives_a_free_block_from_the_middle_of_the_free_list() -> None:
    pool = BlockPool(4)
    pool.release(pool.take_free(4))

    pool.share([pool.blocks[2]])

    assert pool.free_queue.block_ids() == [0, 1, 3]
    assert pool.num_free_blocks == 3
    assert ref_counts(pool) == [0, 0, 1, 0]


def test_share_of_a_held_block_adds_a_reference_and_leaves_the_free_list_alone() -> None:
    pool = BlockPool(4)
    (block,) = pool.take_free(1)

    pool.share([block, block])

    assert block.ref_count == 3
    assert pool.free_queue.block_ids() == [1, 2, 3]


# -- the hash -> block map ---------------------------------------------------------------------


def test_a_cached_block_is_found_by_its_hash() -> None:
    pool = BlockPool(4)
    (block,) = pool.take_free(1)

    pool.cache(block, HASH_A)

    assert pool.lookup(HASH_A) is block
    assert block.block_hash == HASH_A
    assert pool.lookup(HASH_B) is None


def test_the_same_tokens_cached_twice_keep_the_first_block() -> None:
    pool = BlockPool(4)
    first, second = pool.take_free(2)
    pool.cache(first, HASH_A)

    pool.cache(second, HASH_A)

    assert pool.lookup(HASH_A) is first
    assert second.block_hash is None


def test_a_block_keeps_its_first_hash() -> None:
    pool = BlockPool(4)
    (block,) = pool.take_free(1)
    pool.cache(block, HASH_A)

    pool.cache(block, HASH_B)

    assert block.block_hash == HASH_A
    assert pool.lookup(HASH_B) is None


def test_a_freed_cached_block_keeps_its_hash_until_it_is_reused() -> None:
    pool = BlockPool(4)
    (block,) = pool.take_free(1)
    pool.cache(block, HASH_A)
    pool.release([block])

    assert pool.lookup(HASH_A) is block
    assert pool.num_free_blocks == 4
    assert pool.usage == 0.0

    reused = pool.take_free(4)

    assert ids(reused) == [1, 2, 3, 0]
    assert pool.lookup(HASH_A) is None
    assert block.block_hash is None


def test_cached_free_blocks_are_evicted_least_recently_freed_first() -> None:
    pool = BlockPool(4)
    blocks = pool.take_free(4)
    for block, block_hash in zip(blocks, [b"h0", b"h1", b"h2", b"h3"], strict=True):
        pool.cache(block, block_hash)
    pool.release([blocks[2]])
    pool.release([blocks[0]])
    pool.release([blocks[3]])

    (evicted,) = pool.take_free(1)

    assert evicted.block_id == 2
    assert pool.lookup(b"h2") is None
    assert pool.lookup(b"h0") is blocks[0]
    assert pool.lookup(b"h3") is blocks[3]
    assert pool.free_queue.block_ids() == [0, 3]


def test_a_revived_cached_block_is_not_evicted() -> None:
    pool = BlockPool(2)
    first, second = pool.take_free(2)
    pool.cache(first, HASH_A)
    pool.release([first, second])

    pool.share([pool.lookup(HASH_A)])
    (taken,) = pool.take_free(1)

    assert taken is second
    assert pool.lookup(HASH_A) is first
    assert ref_counts(pool) == [1, 1]
    assert pool.num_free_blocks == 0
