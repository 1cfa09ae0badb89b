"""The byte-pair merge loop: bytes of one piece -> token ids, by merge priority.

A merge table maps an adjacent pair of token ids to (priority, merged id); at every step the
pair with the lowest priority value is merged, the leftmost one on ties. This one rule covers
both conventions in use: HF/GGUF merge lists (priority = position in the list, only the listed
pair may merge) and tiktoken rank files (priority = rank of the concatenated bytes, any split
of a token into two tokens may merge), see `pair_table_from_ranks`.
"""

from __future__ import annotations

import heapq
from itertools import repeat
from operator import lshift, or_

from ember.tokenizers.bpe.native import load_native

# Pair keys and table values pack two numbers into one int: fast to hash and compare.
ID_BITS = 22
ID_MASK = (1 << ID_BITS) - 1
MAX_VOCAB = 1 << ID_BITS
# Pieces longer than this use the heap-based merge (O(n log n)) instead of rescanning.
SCAN_LIMIT = 48
# Greater than every table value: "this pair does not merge".
NO_MERGE = 1 << 62
# Constant iterables for the C-level maps in the scan merge (immutable, shared safely).
_ID_SHIFTS = repeat(ID_BITS)
_NO_MERGES = repeat(NO_MERGE)


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
    """Applies a merge table to byte strings.

    `byte_ids[b]` is the token id of the single byte b, None where the vocabulary lacks it:
    such bytes are skipped, as HF's BPE (with no unknown token) and llama.cpp drop them, so
    encoding is total even for vocabularies trained without every byte (SmolLM2 has no token
    for 0xF1, the lead byte of U+40000..U+7FFFF).
    """

    def __init__(
        self, byte_ids: list[int | None], table: dict[int, int], use_native: bool = True
    ) -> None:
        if len(byte_ids) != 256:
            raise ValueError("byte_ids must give one entry per byte value (256)")
        self.byte_ids = byte_ids
        self.table = table
        self.missing_bytes = frozenset(byte for byte, token in enumerate(byte_ids) if token is None)
        # The compiled loop computes exactly what merge_python does, faster (see native.py).
        self._native = load_native(table, byte_ids, ID_BITS) if use_native else None

    @property
    def is_native(self) -> bool:
        """Whether merges run in the compiled core."""
        return self._native is not None

    def merge_uncached(self, data: bytes) -> list[int]:
        """Token ids of one piece, computed (by the compiled core when present)."""
        if self._native is not None:
            ids = self._native.merge(data)
            if ids is not None:
                return ids
        return self.merge_python(data)

    def merge_ids(self, ids: list[int]) -> list[int]:
        """Merges a list of symbol ids (not bytes): for vocabularies whose symbols are
        characters (HF BPE over Metaspace pieces, SentencePiece BPE)."""
        if len(ids) < 2:
            return list(ids)
        if self._native is not None and len(ids) > SCAN_LIMIT:
            merged = self._native.merge_ids(ids)
            if merged is not None:
                return merged
        if len(ids) <= SCAN_LIMIT:
            return self._merge_by_scan(list(ids))
        return self._merge_by_heap(list(ids))

    def merge_python(self, data: bytes) -> list[int]:
        """Token ids of one piece, computed in Python: the reference implementation."""
        ids = list(map(self.byte_ids.__getitem__, data))
        if None in ids:
            ids = [token for token in ids if token is not None]
        if len(ids) < 2:
            return ids
        if len(ids) <= SCAN_LIMIT:
            return self._merge_by_scan(ids)
        return self._merge_by_heap(ids)

    def _merge_by_scan(self, ids: list[int]) -> list[int]:
        # `values[i]` is the table value of the pair (ids[i], ids[i+1]) or NO_MERGE; building
        # it, min() and index() run in C, and a merge re-looks-up only the two pairs beside it.
        get = self.table.get
        keys = map(or_, map(lshift, ids, _ID_SHIFTS), ids[1:])
        values = list(map(get, keys, _NO_MERGES))
        while True:
            best = min(values)
            if best == NO_MERGE:
                break
            at = values.index(best)  # leftmost on ties
            ids[at] = best & ID_MASK
            del ids[at + 1]
            del values[at]
            if not values:
                break
            if at > 0:
                values[at - 1] = get((ids[at - 1] << ID_BITS) | ids[at], NO_MERGE)
            if at < len(values):
                values[at] = get((ids[at] << ID_BITS) | ids[at + 1], NO_MERGE)
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
