"""The block pool: fixed-size KV blocks, their reference counts, hashes, and the LRU free list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class KVBlock:
    """One block of `block_size` token slots in every layer's cache.

    `ref_count` counts the block tables holding it. A free block (ref_count 0) that still
    has a `block_hash` keeps its contents for prefix-cache hits until it is reused.
    `prev_free` / `next_free` thread the free list through the blocks themselves.
    """

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    prev_free: KVBlock | None = None
    next_free: KVBlock | None = None


class FreeBlockQueue:
    """Doubly linked list of free blocks, least recently freed first; O(1) append, pop and remove."""

    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(block_id=-1)  # sentinels: never handed out
        self._tail = KVBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def popleft(self) -> KVBlock:
        first = self._head.next_free
        if first is None or first is self._tail:
            raise RuntimeError("no free KV block left; the cache manager should have checked")
        self.remove(first)
        return first

    def remove(self, block: KVBlock) -> None:
        assert block.prev_free is not None and block.next_free is not None, "block is not in the free list"
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def block_ids(self) -> list[int]:
        """Free block ids in eviction order (for tests and debugging)."""
        ids = []
        node = self._head.next_free
        while node is not None and node is not self._tail:
            ids.append(node.block_id)
            node = node.next_free
        return ids


class BlockPool:
    """Keeps the blocks: hands out free ones (evicting their cached hash), takes them back.

    A block is in the free queue exactly when its ref_count is 0. `cached` maps a full block's
    chained hash to the block holding those tokens' KV. `on_evict` hears of every block handed out
    again, so another index of cached blocks (the radix tree) can forget it.
    """

    def __init__(self, num_blocks: int, on_evict: Callable[[KVBlock], None] | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.blocks = [KVBlock(block_id=i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVBlock] = {}
        self.on_evict = on_evict

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by some request (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def take_free(self, count: int) -> list[KVBlock]:
        """`count` blocks from the front of the free list, each with ref_count 1 and no hash."""
        if count > self.num_free_blocks:
            raise RuntimeError(f"asked for {count} blocks with {self.num_free_blocks} free")
        taken = []
        for _ in range(count):
            block = self.free_queue.popleft()
            self._forget_hash(block)
            if self.on_evict is not None:
                self.on_evict(block)
            block.ref_count = 1
            taken.append(block)
        return taken

    def share(self, blocks: list[KVBlock]) -> None:
        """One more holder for each block (a prefix-cache hit or a fork); revives free ones."""
        for block in blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1

    def release(self, blocks: list[KVBlock]) -> None:
        """One holder fewer; a block nobody holds joins the free list's tail (evicted last)."""
        for block in blocks:
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block.block_id} released more often than it was taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue.append(block)

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)

    def cache(self, block: KVBlock, block_hash: bytes) -> None:
        """Record that `block` holds the full block of tokens `block_hash` names."""
        if block.block_hash is not None or block_hash in self.cached:
            return  # already cached, or the same tokens are cached in another block
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def _forget_hash(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
