"""Per-piece result caches bounded by the memory they hold, not only by how many entries.

A cache keyed by pre-tokenizer pieces must survive hostile input: a 4 MB prompt of one letter
is one 4 MB piece, and five such prompts once held 629 MB in caches bounded by entry count.
Here a piece longer than `max_piece_chars` is never cached (it is rare by nature, and merging
it again is linear-logarithmic anyway), and the estimated bytes held are capped: past the
cap the cache starts over from its seed (e.g. Llama 3's whole-token pieces, which must stay).
"""

from __future__ import annotations

from typing import Generic, TypeVar

Value = TypeVar("Value")

# CPython's costs, rounded up: a dict slot and str header, 4 bytes per character at worst
# (UCS-4), a list header and 8 bytes per element.
ENTRY_OVERHEAD_BYTES = 160
BYTES_PER_CHAR = 4
BYTES_PER_ID = 8


class PieceCache(dict, Generic[Value]):
    """piece -> result. A dict, so that `map(cache.get, pieces)` runs at C speed; write only
    through `remember`, which keeps the bound.

    Invariant: the estimated bytes of the non-seed entries stay <= `max_bytes`.
    """

    def __init__(
        self,
        seed: dict[str, Value] | None = None,
        *,
        max_bytes: int = 64 << 20,
        max_piece_chars: int = 256,
    ) -> None:
        super().__init__(seed or {})
        self._seed = seed or {}
        self.max_bytes = max_bytes
        self.max_piece_chars = max_piece_chars
        self.held_bytes = 0

    def remember(self, piece: str, value: Value) -> None:
        """Caches `value` for `piece` unless the piece is too long to be worth keeping."""
        if len(piece) > self.max_piece_chars:
            return
        cost = ENTRY_OVERHEAD_BYTES + BYTES_PER_CHAR * len(piece)
        if isinstance(value, list):
            cost += BYTES_PER_ID * len(value)
        if self.held_bytes + cost > self.max_bytes:
            self.clear()
            self.update(self._seed)
            self.held_bytes = 0
        self[piece] = value
        self.held_bytes += cost
