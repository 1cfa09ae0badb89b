"""The KV cache manager: gives each sequence the slots it needs, or says no (None).

It owns the per-sequence block tables, the prefix-cache lookup at admission, copy-on-write
for forked sequences, and the hashing of blocks that become full. The block pool below it
only keeps blocks; the scheduler above it decides who runs.

Layers can differ (see `ember.kv.specs`): each layer group has its own block table per
sequence over the shared pool. A windowed group gives back, as its sequence advances, every
block that lies wholly before the window of the next token to compute, and keeps the null
block in its place, so it holds O(window) blocks per sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ember.kv.block_pool import BlockPool, KVBlock
from ember.kv.hashing import hash_block

NULL_BLOCK_ID = -1  # placeholder of a block a windowed group gave back; never read unmasked


@dataclass
class BlockTable:
    """The blocks holding one sequence's KV, in token order, and the chained hashes of its full ones."""

    blocks: list[KVBlock] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)

    @property
    def block_ids(self) -> list[int]:
        """Block ids in token order; NULL_BLOCK_ID where a windowed group gave the block back."""
        return [block.block_id for block in self.blocks]

    @property
    def num_held_blocks(self) -> int:
        """Blocks this table really holds (null placeholders of a window not counted)."""
        return sum(1 for block in self.blocks if block.block_id != NULL_BLOCK_ID)


@dataclass(frozen=True)
class CachedPrefix:
    """Blocks found in the prefix cache for the start of a prompt; no reference taken yet."""

    blocks: tuple[KVBlock, ...] = ()
    block_hashes: tuple[bytes, ...] = ()
    block_size: int = 1
    other_groups: tuple[tuple[KVBlock, ...], ...] = ()  # blocks of layer groups 1.., aligned with `blocks`

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


def blocks_needed(
    num_tokens: int, block_size: int, group_windows: Sequence[int | None], max_chunk_tokens: int | None = None
) -> int:
    """Most blocks one sequence of `num_tokens` holds at once over all layer groups.

    A windowed group holds at most the blocks its window spans plus one step's chunk.
    """
    full = -(-num_tokens // block_size)
    total = 0
    for window in group_windows:
        if window is None:
            total += full
        else:
            span = window + (max_chunk_tokens or num_tokens)
            total += min(full, -(-span // block_size) + 1)
    return total


class KVCacheManager:
    """Block tables per sequence (one per layer group) over one block pool.

    `group_windows` gives each layer group's sliding window (None: full attention); the
    default is one full-attention group, where every layer sees every token.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        group_windows: Sequence[int | None] = (None,),
    ) -> None:
        if not group_windows:
            raise ValueError("the KV cache needs at least one layer group")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.group_windows = tuple(group_windows)
        self.pool = BlockPool(num_blocks)
        self.null_block = KVBlock(block_id=NULL_BLOCK_ID)
        self.group_tables: list[dict[str, BlockTable]] = [{} for _ in self.group_windows]
        self.tables = self.group_tables[0]
        self.prefix_stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, free or held."""
        return self.pool.num_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def block_table(self, seq_id: str) -> BlockTable:
        """The block table of the first layer group (the only one of a plain model)."""
        return self.tables[seq_id]

    def block_tables(self, seq_id: str) -> list[BlockTable]:
        """One block table per layer group, in group order."""
        return [tables[seq_id] for tables in self.group_tables]

    def block_ids(self, seq_id: str) -> tuple[list[int], ...]:
        """The block ids of `seq_id`'s table in each layer group, in group order: what a step's plan hands the runner."""
        return tuple(tables[seq_id].block_ids for tables in self.group_tables)

    def num_blocks_needed(self, num_tokens: int, max_chunk_tokens: int | None = None) -> int:
        """Most blocks one sequence of `num_tokens` holds at once over all groups."""
        return blocks_needed(num_tokens, self.block_size, self.group_windows, max_chunk_tokens)

    def find_cached_prefix(self, token_ids: Sequence[int], max_tokens: int, extra_keys: tuple = ()) -> CachedPrefix:
        """Longest run of full blocks of `token_ids[:max_tokens]` whose KV every layer group still has.

        A full-attention group needs every block of the run; a windowed group only the blocks
        the window of the first token after the run reaches into.
        """
        if not self.enable_prefix_caching:
            return CachedPrefix(block_size=self.block_size)
        full_groups = [g for g, window in enumerate(self.group_windows) if window is None]
        hashes: list[bytes] = []
        parent = None
        for start in range(0, max_tokens - self.block_size + 1, self.block_size):
            parent = hash_block(parent, token_ids[start : start + self.block_size], extra_keys)
            if any(self.pool.lookup(self._key(parent, g)) is None for g in full_groups):
                break
            hashes.append(parent)
        windowed_groups = [g for g, window in enumerate(self.group_windows) if window is not None]
        num_hit = len(hashes)
        while num_hit > 0 and not all(self._window_hit(g, hashes, num_hit) for g in windowed_groups):
            num_hit -= 1
        groups = tuple(self._prefix_blocks(g, hashes, num_hit) for g in range(len(self.group_windows)))
        return CachedPrefix(groups[0], tuple(hashes[:num_hit]), self.block_size, groups[1:])

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
        nothing has changed but the return of blocks no window reaches any more. `cached_prefix`
        (admission only) is adopted before allocating and counted in the prefix-cache statistics.
        """
        prefix = cached_prefix or CachedPrefix(block_size=self.block_size)
        prefix_groups = (prefix.blocks, *prefix.other_groups) if prefix.blocks else ((),) * len(self.group_windows)
        tables = [group.get(seq_id) or BlockTable() for group in self.group_tables]
        for table, window in zip(tables, self.group_windows, strict=True):
            if window is not None:
                self._release_outside_window(table, num_computed_tokens, window)
        num_needed = -(-(num_computed_tokens + num_new_tokens) // self.block_size)
        needs_copy = [self._needs_copy(table, num_computed_tokens) for table in tables]
        num_new_blocks = sum(
            max(0, num_needed - len(table.blocks) - len(blocks)) for table, blocks in zip(tables, prefix_groups, strict=True)
        )
        revived = sum(1 for blocks in prefix_groups for block in blocks if block.ref_count == 0 and block is not self.null_block)
        if num_new_blocks + sum(needs_copy) + revived > self.pool.num_free_blocks:
            return None
        if cached_prefix is not None:
            self.prefix_stats.queries += len(token_ids)
            self.prefix_stats.hits += prefix.num_tokens
        copies = []
        for group, (table, blocks) in enumerate(zip(tables, prefix_groups, strict=True)):
            self.group_tables[group][seq_id] = table
            if blocks:
                self.pool.share([block for block in blocks if block is not self.null_block])
                table.blocks.extend(blocks)
                table.block_hashes.extend(prefix.block_hashes)
            if needs_copy[group]:
                copies.append(self._copy_on_write(table, num_computed_tokens))
            table.blocks.extend(self.pool.take_free(max(0, num_needed - len(table.blocks))))
            self._cache_full_blocks(table, token_ids, num_computed_tokens + num_new_tokens, extra_keys, group)
        return copies

    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares every block of the parent; a later write to a shared partial block copies it."""
        for tables in self.group_tables:
            parent = tables[parent_id]
            self.pool.share(self._held(parent.blocks))
            tables[child_id] = BlockTable(list(parent.blocks), list(parent.block_hashes))

    def trim(self, seq_id: str, num_tokens: int) -> None:
        """Keep only the blocks covering a sequence's first `num_tokens` tokens; give back the rest.

        This rolls back the slots of rejected drafted tokens. No hash is lost: blocks are
        registered only once full of the sequence's own tokens, which all lie before `num_tokens`.
        """
        num_kept = -(-num_tokens // self.block_size)
        for tables in self.group_tables:
            table = tables.get(seq_id)
            if table is None or len(table.blocks) <= num_kept:
                continue
            assert len(table.block_hashes) <= num_kept, "a block past the computed tokens was registered"
            dropped = table.blocks[num_kept:]
            del table.blocks[num_kept:]
            self.pool.release(self._held(reversed(dropped)))

    def free(self, seq_id: str) -> None:
        """Give back a sequence's blocks, last block first, so a prompt's tail is evicted before its head."""
        for tables in self.group_tables:
            table = tables.pop(seq_id, None)
            if table is not None:
                self.pool.release(self._held(reversed(table.blocks)))

    def _held(self, blocks: Iterable[KVBlock]) -> list[KVBlock]:
        return [block for block in blocks if block is not self.null_block]

    def _key(self, block_hash: bytes, group: int) -> bytes:
        """Pool key of a block hash in one layer group (group 0 keeps the plain hash)."""
        return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")

    def _first_needed_block(self, num_computed_tokens: int, window: int | None) -> int:
        """Index of the first block the window of token `num_computed_tokens` reaches."""
        if window is None:
            return 0
        return max(0, num_computed_tokens - window + 1) // self.block_size

    def _window_hit(self, group: int, hashes: list[bytes], num_hit: int) -> bool:
        first = self._first_needed_block(num_hit * self.block_size, self.group_windows[group])
        return all(self.pool.lookup(self._key(h, group)) is not None for h in hashes[first:num_hit])

    def _prefix_blocks(self, group: int, hashes: list[bytes], num_hit: int) -> tuple[KVBlock, ...]:
        first = self._first_needed_block(num_hit * self.block_size, self.group_windows[group])
        found = [self.pool.lookup(self._key(h, group)) for h in hashes[first:num_hit]]
        assert all(block is not None for block in found)
        return (self.null_block,) * first + tuple(found)  # type: ignore[arg-type]

    def _release_outside_window(self, table: BlockTable, num_computed_tokens: int, window: int) -> None:
        """Give back the blocks wholly before the window of the next token to compute."""
        first = min(self._first_needed_block(num_computed_tokens, window), len(table.blocks))
        outside = [block for block in table.blocks[:first] if block is not self.null_block]
        if outside:
            self.pool.release(outside)
            table.blocks[:first] = [self.null_block] * first

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

    def _cache_full_blocks(
        self, table: BlockTable, token_ids: Sequence[int], num_tokens: int, extra_keys: tuple, group: int = 0
    ) -> None:
        """Hash and register every block that is full once `num_tokens` tokens are in.

        Registered at allocation, before the step computes them: a request admitted later in
        the same step may hit these blocks, which is sound because every attention layer
        writes all new keys and values of the step before any request reads the cache.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_tokens, len(token_ids)) // self.block_size
        for index in range(len(table.block_hashes), num_full):
            parent = table.block_hashes[-1] if table.block_hashes else None
            start = index * self.block_size
            block_hash = hash_block(parent, token_ids[start : start + self.block_size], extra_keys)
            table.block_hashes.append(block_hash)
            if table.blocks[index] is not self.null_block:
                self.pool.cache(table.blocks[index], self._key(block_hash, group))
