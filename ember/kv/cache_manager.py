"""The KV cache manager: gives each sequence the slots it needs, or says no (None).

It owns the per-sequence block tables, the prefix-cache lookup at admission, copy-on-write
for forked sequences, and the hashing of blocks that become full. The block pool below it
only keeps blocks; the scheduler above it decides who runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ember.kv.block_pool import BlockPool, KVBlock
from ember.kv.hashing import hash_block


@dataclass
class BlockTable:
    """The blocks holding one sequence's KV, in token order, and the chained hashes of its full ones."""

    blocks: list[KVBlock] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)

    @property
    def block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks]


@dataclass(frozen=True)
class CachedPrefix:
    """Blocks found in the prefix cache for the start of a prompt; no reference taken yet."""

    blocks: tuple[KVBlock, ...] = ()
    block_hashes: tuple[bytes, ...] = ()
    block_size: int = 1

    @property
    def num_tokens(self) -> int:
        return len(self.blocks) * self.block_size


@dataclass(frozen=True)
class BlockCopy:
    """Copy one block's KV to another before the step runs (copy-on-write of a shared partial block)."""

    source: int
    destination: int


@dataclass
class PrefixCacheStats:
    """Prompt tokens looked up in the prefix cache, and how many were found."""

    queries: int = 0
    hits: int = 0


class KVCacheManager:
    """Block tables per sequence over one block pool."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.tables: dict[str, BlockTable] = {}
        self.prefix_stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def block_table(self, seq_id: str) -> BlockTable:
        return self.tables[seq_id]

    def find_cached_prefix(self, token_ids: Sequence[int], max_tokens: int, extra_keys: tuple = ()) -> CachedPrefix:
        """Longest run of full blocks of `token_ids[:max_tokens]` already in the cache."""
        if not self.enable_prefix_caching:
            return CachedPrefix(block_size=self.block_size)
        blocks: list[KVBlock] = []
        hashes: list[bytes] = []
        parent = None
        for start in range(0, max_tokens - self.block_size + 1, self.block_size):
            parent = hash_block(parent, token_ids[start : start + self.block_size], extra_keys)
            block = self.pool.lookup(parent)
            if block is None:
                break
            blocks.append(block)
            hashes.append(parent)
        return CachedPrefix(tuple(blocks), tuple(hashes), self.block_size)

    def allocate_slots(
        self,
        seq_id: str,
        token_ids: Sequence[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        cached_prefix: CachedPrefix | None = None,
        extra_keys: tuple = (),
    ) -> list[BlockCopy] | None:
        """Make room for `num_new_tokens` after `num_computed_tokens`; None if the pool cannot.

        On success returns the block copies the runner must do first (copy-on-write). On None
        nothing has changed. `cached_prefix` (admission only) is adopted before allocating and
        counted in the prefix-cache statistics.
        """
        table = self.tables.get(seq_id) or BlockTable()
        prefix = cached_prefix or CachedPrefix(block_size=self.block_size)
        num_held = len(table.blocks) + len(prefix.blocks)
        num_needed = -(-(num_computed_tokens + num_new_tokens) // self.block_size)
        needs_copy = self._needs_copy(table, num_computed_tokens)
        revived = sum(1 for block in prefix.blocks if block.ref_count == 0)
        if max(0, num_needed - num_held) + int(needs_copy) + revived > self.pool.num_free_blocks:
            return None
        self.tables[seq_id] = table
        if cached_prefix is not None:
            self.prefix_stats.queries += len(token_ids)
            self.prefix_stats.hits += prefix.num_tokens
        if prefix.blocks:
            self.pool.share(list(prefix.blocks))
            table.blocks.extend(prefix.blocks)
            table.block_hashes.extend(prefix.block_hashes)
        copies = [self._copy_on_write(table, num_computed_tokens)] if needs_copy else []
        table.blocks.extend(self.pool.take_free(max(0, num_needed - len(table.blocks))))
        self._cache_full_blocks(table, token_ids, num_computed_tokens + num_new_tokens, extra_keys)
        return copies

    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares every block of the parent; a later write to a shared partial block copies it."""
        parent = self.tables[parent_id]
        self.pool.share(parent.blocks)
        self.tables[child_id] = BlockTable(list(parent.blocks), list(parent.block_hashes))

    def free(self, seq_id: str) -> None:
        """Give back a sequence's blocks, last block first, so a prompt's tail is evicted before its head."""
        table = self.tables.pop(seq_id, None)
        if table is not None:
            self.pool.release(list(reversed(table.blocks)))

    def _needs_copy(self, table: BlockTable, num_computed_tokens: int) -> bool:
        """Whether the next write lands in a partial block another sequence also holds."""
        if num_computed_tokens % self.block_size == 0:
            return False
        index = num_computed_tokens // self.block_size
        return index < len(table.blocks) and table.blocks[index].ref_count > 1

    def _copy_on_write(self, table: BlockTable, num_computed_tokens: int) -> BlockCopy:
        index = num_computed_tokens // self.block_size
        shared = table.blocks[index]
        (private,) = self.pool.take_free(1)
        self.pool.release([shared])
        table.blocks[index] = private
        return BlockCopy(source=shared.block_id, destination=private.block_id)

    def _cache_full_blocks(self, table: BlockTable, token_ids: Sequence[int], num_tokens: int, extra_keys: tuple) -> None:
        """Hash and register every block that is full once `num_tokens` tokens are in."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_tokens, len(token_ids)) // self.block_size
        for index in range(len(table.block_hashes), num_full):
            parent = table.block_hashes[-1] if table.block_hashes else None
            start = index * self.block_size
            block_hash = hash_block(parent, token_ids[start : start + self.block_size], extra_keys)
            table.block_hashes.append(block_hash)
            self.pool.cache(table.blocks[index], block_hash)
