"""The byte-pair merge loop: bytes of one piece -> token ids, by merge priority.

A merge table maps an adjacent pair of token ids to (priority, merged id); at every step the
pair with the lowest priority value is merged, the leftmost one on ties. This one rule covers
both conventions in use: HF/GGUF merge lists (priority = position in the list, only the listed
pair may merge) and tiktoken rank files (priority = rank of the concatenated bytes, any split
of a token into two tokens may merge), see `pair_table_from_ranks`.
"""

from __future__ import annotations

import heapq

# Pair keys and table values pack two numbers into one int: fast to hash and compare.
ID_BITS = 22
ID_MASK = (1 << ID_BITS) - 1
MAX_VOCAB = 1 << ID_BITS
# Pieces longer than this use the heap-based merge (O(n log n)) instead of rescanning.
SCAN_LIMIT = 48
CACHE_LIMIT = 200_000


def pair_key(left: int, right: int) -> int:
    """The table key of the adjacent pair (left, right)."""
    return (left << ID_BITS) | right


def pair_value(priority: int, merged_id: int) -> int:
    """The table value: ordering by it orders by priority first."""
    return (priority << ID_BITS) | merged_id


def pair_table_from_ranks(ranks: dict[bytes, int]) -> dict[int, int]:
    """tiktoken's rule as a pair table: every split of a token into two tokens merges into it,
    with the token's rank as priority."""
    table: dict[int, int] = {}
    get = ranks.get
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left = get(token[:cut])
            if left is None:
                continue
            right = get(token[cut:])
            if right is not None:
                table[pair_key(left, right)] = pair_value(rank, rank)
    return table


class BytePairMerger:
    """Applies a merge table to byte strings, with a per-instance cache of results.

    `byte_ids[b]` is the token id of the single byte b (None where the vocabulary lacks it:
    encoding such a byte raises ValueError).
    """

    def __init__(self, byte_ids: list[int | None], table: dict[int, int]) -> None:
        if len(byte_ids) != 256:
            raise ValueError("byte_ids must give one entry per byte value (256)")
        self.byte_ids = byte_ids
        self.table = table
        self._cache: dict[bytes, list[int]] = {}

    def merge(self, data: bytes) -> list[int]:
        """Token ids of one piece (cached)."""
        ids = self._cache.get(data)
        if ids is None:
            ids = self.merge_uncached(data)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[data] = ids
        return ids

    def merge_uncached(self, data: bytes) -> list[int]:
        """Token ids of one piece, computed."""
        byte_ids = self.byte_ids
        try:
            ids = [byte_ids[b] for b in data]
            if None in ids:
                raise TypeError
        except TypeError:
            missing = next(b for b in data if byte_ids[b] is None)
            raise ValueError(
                f"byte 0x{missing:02X} has no token in this vocabulary; it cannot be encoded"
            ) from None
        if len(ids) <= SCAN_LIMIT:
            return self._merge_by_scan(ids)
        return self._merge_by_heap(ids)

    def _merge_by_scan(self, ids: list[int]) -> list[int]:
        get = self.table.get
        while len(ids) > 1:
            best = None
            best_at = 0
            left = ids[0]
            for at in range(1, len(ids)):
                right = ids[at]
                value = get((left << ID_BITS) | right)
                if value is not None and (best is None or value < best):
                    best = value
                    best_at = at - 1
                left = right
            if best is None:
                break
            ids[best_at : best_at + 2] = [best & ID_MASK]
        return ids

    def _merge_by_heap(self, ids: list[int]) -> list[int]:
        # Linked list over positions; heap of (value, position) for each mergeable pair.
        # A popped entry is stale when its position was merged away or its pair changed.
        get = self.table.get
        count = len(ids)
        next_at = list(range(1, count + 1))
        prev_at = list(range(-1, count - 1))
        alive = [True] * count
        heap = []
        for at in range(count - 1):
            value = get((ids[at] << ID_BITS) | ids[at + 1])
            if value is not None:
                heap.append((value, at))
        heapq.heapify(heap)
        while heap:
            value, at = heapq.heappop(heap)
            if not alive[at]:
                continue
            right_at = next_at[at]
            if right_at >= count or get((ids[at] << ID_BITS) | ids[right_at]) != value:
                continue
            ids[at] = value & ID_MASK
            alive[right_at] = False
            after = next_at[right_at]
            next_at[at] = after
            if after < count:
                prev_at[after] = at
                follow = get((ids[at] << ID_BITS) | ids[after])
                if follow is not None:
                    heapq.heappush(heap, (follow, at))
            before = prev_at[at]
            if before >= 0:
                lead = get((ids[before] << ID_BITS) | ids[at])
                if lead is not None:
                    heapq.heappush(heap, (lead, before))
        return [token for token, keep in zip(ids, alive, strict=False) if keep]
