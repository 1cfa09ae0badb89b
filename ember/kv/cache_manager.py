"""The KV cache manager: gives each sequence the slots it needs, or says no (None).

It owns the per-sequence block tables, the prefix-cache lookup at admission, copy-on-write
for forked sequences and for a cached prefix that ends inside a block, and the recording of
computed tokens in the prefix cache. The block pool below it only keeps blocks; the scheduler
above it decides who runs.

Two prefix caches: "hash" keys each full block by a chained hash (a prompt reuses whole blocks
only); "radix" keeps a token-granular radix tree (`ember.kv.radix`), so a prompt reuses a cached
block's first tokens too, copied into a block of its own before the step writes past them.

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
from ember.kv.radix import RadixTree

PREFIX_CACHES = ("radix", "hash")

NULL_BLOCK_ID = -1  # placeholder of a block a windowed group gave back; never read unmasked


@dataclass
class BlockTable:
    """The blocks holding one sequence's KV, in token order, and the chained hashes of its full ones."""

    blocks: list[KVBlock] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    # Block index -> the cached block a partial prefix hit copied into `blocks[index]`. The table holds it
    # until it gives back that index, then releases it right after its copy, so the pool's LRU reaches the
    # radix tree's leaf (the copy) before the node above it (the source).
    copy_sources: dict[int, KVBlock] = field(default_factory=dict)

    def blocks_last_first(self, end: int | None = None) -> list[KVBlock]:
        """The blocks before index `end` (all by default), last first, each copy's source right after it."""
        held = []
        for index in reversed(range(len(self.blocks) if end is None else end)):
            held.append(self.blocks[index])
            if index in self.copy_sources:
                held.append(self.copy_sources.pop(index))
        return held

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
    """The first `num_tokens` tokens of a prompt found in the prefix cache, and their blocks; no reference taken yet.

    When `num_tokens` ends inside a block, the last block is shared only until the sequence copies it.
    """

    blocks: tuple[KVBlock, ...] = ()
    block_hashes: tuple[bytes, ...] = ()  # the hash cache's keys of `blocks`
    num_tokens: int = 0
    other_groups: tuple[tuple[KVBlock, ...], ...] = ()  # blocks of layer groups 1.., aligned with `blocks`


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
    default is one full-attention group, where every layer sees every token. `prefix_cache`
    picks the prefix cache: "hash" (whole blocks) or "radix" (token-granular).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        group_windows: Sequence[int | None] = (None,),
        prefix_cache: str = "hash",
    ) -> None:
        if not group_windows:
            raise ValueError("the KV cache needs at least one layer group")
        if prefix_cache not in PREFIX_CACHES:
            raise ValueError(f"prefix_cache {prefix_cache!r} is not known; choose one of {', '.join(PREFIX_CACHES)}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.group_windows = tuple(group_windows)
        windowed = frozenset(g for g, window in enumerate(self.group_windows) if window is not None)
        self.radix = RadixTree(block_size, len(self.group_windows), windowed) if prefix_cache == "radix" else None
        self.pool = BlockPool(num_blocks, on_evict=self.radix.evict if self.radix is not None else None)
        # Radix only: blocks registered at allocation, before the step computes them, by the sequence that
        # will; a cached prefix may not end inside one (its copy would be taken before the step writes it).
        self._pending: dict[str, list[KVBlock]] = {}
        self._num_registered: dict[str, int] = {}
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
            return CachedPrefix()
        if self.radix is not None:
            return self._find_radix_prefix(token_ids, max_tokens, extra_keys)
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
        return CachedPrefix(groups[0], tuple(hashes[:num_hit]), num_hit * self.block_size, groups[1:])

    def _find_radix_prefix(self, token_ids: Sequence[int], max_tokens: int, extra_keys: tuple) -> CachedPrefix:
        """The radix tree's longest match, cut back to what every group has and whose partial block is computed.

        A windowed group needs the blocks the window of the first token after the match reaches into.
        """
        assert self.radix is not None
        match = self.radix.match(token_ids, max_tokens, extra_keys)
        pending = {block for blocks in self._pending.values() for block in blocks}
        num_tokens = match.num_tokens
        if num_tokens % self.block_size and any(
            blocks[num_tokens // self.block_size] in pending for blocks in match.blocks
        ):
            num_tokens -= num_tokens % self.block_size
        while num_tokens > 0 and not all(self._radix_window_hit(blocks, g, num_tokens) for g, blocks in enumerate(match.blocks)):
            num_tokens = (num_tokens - 1) // self.block_size * self.block_size
        if num_tokens == 0:
            return CachedPrefix()
        num_blocks = -(-num_tokens // self.block_size)
        groups = []
        for group, blocks in enumerate(match.blocks):
            first = self._first_needed_block(num_tokens, self.group_windows[group])
            groups.append((self.null_block,) * first + tuple(blocks[first:num_blocks]))
        return CachedPrefix(groups[0], (), num_tokens, tuple(groups[1:]))

    def _radix_window_hit(self, blocks: Sequence[KVBlock | None], group: int, num_tokens: int) -> bool:
        first = self._first_needed_block(num_tokens, self.group_windows[group])
        return all(block is not None for block in blocks[first : -(-num_tokens // self.block_size)])

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
        prefix = cached_prefix or CachedPrefix()
        prefix_groups = (prefix.blocks, *prefix.other_groups) if prefix.blocks else ((),) * len(self.group_windows)
        tables = [group.get(seq_id) or BlockTable() for group in self.group_tables]
        for table, window in zip(tables, self.group_windows, strict=True):
            if window is not None:
                self._release_outside_window(table, num_computed_tokens, window)
        num_needed = -(-(num_computed_tokens + num_new_tokens) // self.block_size)
        # A prefix ending inside a block shares that block only until its copy: the tree keeps the original.
        copies_partial = prefix.num_tokens % self.block_size != 0
        needs_copy = [copies_partial or self._needs_copy(table, num_computed_tokens) for table in tables]
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
            if copies_partial:
                copies.append(self._copy_partial_prefix_block(table, num_computed_tokens))
            elif needs_copy[group]:
                copies.append(self._copy_on_write(table, num_computed_tokens))
            table.blocks.extend(self.pool.take_free(max(0, num_needed - len(table.blocks))))
            if self.radix is None:
                self._cache_full_blocks(table, token_ids, num_computed_tokens + num_new_tokens, extra_keys, group)
        if self.radix is not None and self.enable_prefix_caching:
            self._register_radix(seq_id, tables, token_ids, num_computed_tokens, num_new_tokens, extra_keys)
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

    def free(self, seq_id: str, computed_token_ids: Sequence[int] = (), extra_keys: tuple = ()) -> None:
        """Give back a sequence's blocks, last block first, so a prompt's tail is evicted before its head.

        `computed_token_ids` (the tokens whose KV the sequence's blocks hold) go into the radix tree
        first (under `extra_keys`), to the last token: a later prompt may reuse the blocks' first tokens.
        """
        self._pending.pop(seq_id, None)
        self._num_registered.pop(seq_id, None)
        if self.radix is not None and self.enable_prefix_caching and computed_token_ids and seq_id in self.tables:
            self.radix.insert(computed_token_ids, len(computed_token_ids), self._radix_blocks(self.block_tables(seq_id)),
                              extra_keys)
        for tables in self.group_tables:
            table = tables.pop(seq_id, None)
            if table is not None:
                self.pool.release(self._held(table.blocks_last_first()))

    def _register_radix(self, seq_id: str, tables: list[BlockTable], token_ids: Sequence[int], num_computed_tokens: int,
                        num_new_tokens: int, extra_keys: tuple) -> None:
        """Put the sequence's newly full blocks in the radix tree; those the step has yet to compute are pending.

        Whole blocks are registered before the step runs (a request admitted in the same step may share
        them, as with the hash cache); a partial last block goes in when the sequence is freed.
        """
        assert self.radix is not None
        self._pending.pop(seq_id, None)
        num_full = min(num_computed_tokens + num_new_tokens, len(token_ids)) // self.block_size
        if num_full <= self._num_registered.get(seq_id, 0):
            return
        self._num_registered[seq_id] = num_full
        self.radix.insert(token_ids, num_full * self.block_size, self._radix_blocks(tables), extra_keys)
        first_pending = num_computed_tokens // self.block_size
        self._pending[seq_id] = [block for table in tables for block in table.blocks[first_pending:num_full]]

    def _radix_blocks(self, tables: list[BlockTable]) -> list[list[KVBlock | None]]:
        return [[None if block is self.null_block else block for block in table.blocks] for table in tables]

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
        outside += [table.copy_sources.pop(index) for index in sorted(table.copy_sources) if index < first]
        if outside:
            self.pool.release(outside)
            table.blocks[:first] = [self.null_block] * first

    def _needs_copy(self, table: BlockTable, num_computed_tokens: int) -> bool:
        """Whether the next write lands in a partial block another sequence also holds."""
        if num_computed_tokens % self.block_size == 0:
            return False
        index = num_computed_tokens // self.block_size
        return index < len(table.blocks) and table.blocks[index].ref_count > 1

    def _copy_partial_prefix_block(self, table: BlockTable, num_computed_tokens: int) -> BlockCopy:
        """A private copy of the cached block a prefix ends inside; the table keeps holding the source (see BlockTable)."""
        index = num_computed_tokens // self.block_size
        source = table.blocks[index]
        (private,) = self.pool.take_free(1)
        table.blocks[index] = private
        table.copy_sources[index] = source
        return BlockCopy(source=source.block_id, destination=private.block_id)

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
