"""An optional compiled merge loop (C, built on first use with the system compiler).

The pure-Python merge loop in merges.py is the reference and the fallback: this module only
makes the same computation faster when a C compiler is present. The shared library is built
once per source version into ember's cache folder (ember.native_build) and loaded with ctypes. Set EMBER_TOKENIZERS_PURE_PYTHON=1 to never use it.
Any failure to build or load quietly means "not available".
"""

from __future__ import annotations

import ctypes
import os
from array import array
from pathlib import Path

from ember.native_build import build_shared_library

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>

/* Open-addressing hash table: pair key (left << 22 | right) -> merge value. */
typedef struct { uint64_t *keys; uint64_t *values; uint64_t mask; } table_t;

static uint64_t slot_of(uint64_t key, uint64_t mask) {
    key ^= key >> 31; key *= 0x9E3779B97F4A7C15ULL; key ^= key >> 29;
    return key & mask;
}

void *ember_table_new(const uint64_t *keys, const uint64_t *values, int64_t count) {
    table_t *table = (table_t *)malloc(sizeof(table_t));
    if (!table) return 0;
    uint64_t size = 16;
    while (size < (uint64_t)count * 2 + 16) size <<= 1;
    table->mask = size - 1;
    table->keys = (uint64_t *)calloc(size, sizeof(uint64_t));
    table->values = (uint64_t *)calloc(size, sizeof(uint64_t));
    if (!table->keys || !table->values) { free(table->keys); free(table->values); free(table); return 0; }
    for (int64_t i = 0; i < count; i++) {
        uint64_t stored = keys[i] + 1;  /* 0 marks an empty slot */
        uint64_t slot = slot_of(stored, table->mask);
        while (table->keys[slot] && table->keys[slot] != stored) slot = (slot + 1) & table->mask;
        table->keys[slot] = stored;
        table->values[slot] = values[i];
    }
    return table;
}

void ember_table_free(void *pointer) {
    table_t *table = (table_t *)pointer;
    if (!table) return;
    free(table->keys); free(table->values); free(table);
}

static uint64_t lookup(const table_t *table, uint64_t key, uint64_t missing) {
    uint64_t stored = key + 1;
    uint64_t slot = slot_of(stored, table->mask);
    while (table->keys[slot]) {
        if (table->keys[slot] == stored) return table->values[slot];
        slot = (slot + 1) & table->mask;
    }
    return missing;
}

/* Ids of the bytes of a piece, skipping bytes that have no token (as HF's BPE and llama.cpp
   drop them); returns how many were written to out. */
static int64_t byte_tokens(const int64_t *byte_ids, const uint8_t *data, int64_t length, int64_t *out) {
    int64_t count = 0;
    for (int64_t i = 0; i < length; i++) {
        int64_t id = byte_ids[data[i]];
        if (id >= 0) out[count++] = id;
    }
    return count;
}

/* Merges the bytes of one short piece by rescanning; writes ids to out (capacity >= length)
   and returns their count. Lowest value first, leftmost on ties. */
int64_t ember_merge(const void *pointer, const int64_t *byte_ids, const uint8_t *data,
                    int64_t length, int64_t *out, uint64_t *values, int64_t id_bits) {
    const table_t *table = (const table_t *)pointer;
    const uint64_t missing = ~(uint64_t)0;
    const uint64_t id_mask = (((uint64_t)1) << id_bits) - 1;
    int64_t count = byte_tokens(byte_ids, data, length, out);
    for (int64_t i = 0; i + 1 < count; i++)
        values[i] = lookup(table, ((uint64_t)out[i] << id_bits) | (uint64_t)out[i + 1], missing);
    while (count > 1) {
        uint64_t best = missing; int64_t at = -1;
        for (int64_t i = 0; i + 1 < count; i++)
            if (values[i] < best) { best = values[i]; at = i; }
        if (at < 0) break;
        out[at] = (int64_t)(best & id_mask);
        for (int64_t i = at + 1; i + 1 < count; i++) out[i] = out[i + 1];
        for (int64_t i = at; i + 2 < count; i++) values[i] = values[i + 1];
        count--;
        if (at > 0)
            values[at - 1] = lookup(table, ((uint64_t)out[at - 1] << id_bits) | (uint64_t)out[at], missing);
        if (at + 1 < count)
            values[at] = lookup(table, ((uint64_t)out[at] << id_bits) | (uint64_t)out[at + 1], missing);
    }
    return count;
}

/* The same merges for long pieces in O(n log n): a linked list over positions and a binary
   heap of (value, left position) candidates; a popped candidate is stale when its left
   symbol was merged away or its pair no longer has that value. Returns the count, or -1 when
   scratch memory cannot be allocated. */
typedef struct { uint64_t priority; uint64_t value; int64_t at; } candidate_t;

/* Lower priority first, then leftmost: two pairs with equal priority but different merged
   tokens (SentencePiece pieces of equal score) go by position, as sentencepiece does. */
static int before(candidate_t a, candidate_t b) {
    return a.priority < b.priority || (a.priority == b.priority && a.at < b.at);
}

static void heap_push(candidate_t *heap, int64_t *size, candidate_t item) {
    int64_t i = (*size)++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!before(item, heap[parent])) break;
        heap[i] = heap[parent]; i = parent;
    }
    heap[i] = item;
}

static candidate_t heap_pop(candidate_t *heap, int64_t *size) {
    candidate_t top = heap[0], last = heap[--(*size)];
    int64_t i = 0;
    for (;;) {
        int64_t child = 2 * i + 1;
        if (child >= *size) break;
        if (child + 1 < *size && before(heap[child + 1], heap[child])) child++;
        if (!before(heap[child], last)) break;
        heap[i] = heap[child]; i = child;
    }
    if (*size > 0) heap[i] = last;
    return top;
}

/* Merges the ids in out[0..count) in place with the heap; returns the new count or -1. */
static int64_t merge_heap(const table_t *table, int64_t *out, int64_t count, int64_t id_bits) {
    const uint64_t missing = ~(uint64_t)0;
    const uint64_t id_mask = (((uint64_t)1) << id_bits) - 1;
    if (count < 2) return count;
    int64_t *next = (int64_t *)malloc(sizeof(int64_t) * count);
    int64_t *prev = (int64_t *)malloc(sizeof(int64_t) * count);
    /* every merge pushes at most two candidates: count - 1 initial + 2 per merge */
    candidate_t *heap = (candidate_t *)malloc(sizeof(candidate_t) * 3 * count);
    if (!next || !prev || !heap) { free(next); free(prev); free(heap); return -1; }
    int64_t size = 0;
    for (int64_t i = 0; i < count; i++) { next[i] = i + 1; prev[i] = i - 1; }
    for (int64_t i = 0; i + 1 < count; i++) {
        uint64_t value = lookup(table, ((uint64_t)out[i] << id_bits) | (uint64_t)out[i + 1], missing);
        if (value != missing) { candidate_t c = {value >> id_bits, value, i}; heap_push(heap, &size, c); }
    }
    while (size > 0) {
        candidate_t top = heap_pop(heap, &size);
        int64_t at = top.at;
        if (out[at] < 0) continue;  /* merged away */
        int64_t right = next[at];
        if (right >= count) continue;
        if (lookup(table, ((uint64_t)out[at] << id_bits) | (uint64_t)out[right], missing) != top.value) continue;
        out[at] = (int64_t)(top.value & id_mask);
        out[right] = -1;
        int64_t after = next[right];
        next[at] = after;
        if (after < count) {
            prev[after] = at;
            uint64_t value = lookup(table, ((uint64_t)out[at] << id_bits) | (uint64_t)out[after], missing);
            if (value != missing) { candidate_t c = {value >> id_bits, value, at}; heap_push(heap, &size, c); }
        }
        int64_t left = prev[at];
        if (left >= 0) {
            uint64_t value = lookup(table, ((uint64_t)out[left] << id_bits) | (uint64_t)out[at], missing);
            if (value != missing) { candidate_t c = {value >> id_bits, value, left}; heap_push(heap, &size, c); }
        }
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < count; i++) if (out[i] >= 0) out[kept++] = out[i];
    free(next); free(prev); free(heap);
    return kept;
}

int64_t ember_merge_long(const void *pointer, const int64_t *byte_ids, const uint8_t *data,
                         int64_t length, int64_t *out, int64_t id_bits) {
    int64_t count = byte_tokens(byte_ids, data, length, out);
    return merge_heap((const table_t *)pointer, out, count, id_bits);
}

/* The heap merge over symbol ids given directly (ids >= 0); in place in ids. */
int64_t ember_merge_ids(const void *pointer, int64_t *ids, int64_t count, int64_t id_bits) {
    return merge_heap((const table_t *)pointer, ids, count, id_bits);
}
"""

PURE_PYTHON_ENV = "EMBER_TOKENIZERS_PURE_PYTHON"


def build_library() -> Path | None:
    """Path of the compiled merge loop, building it if needed; None when that is impossible."""
    if os.environ.get(PURE_PYTHON_ENV):
        return None
    return build_shared_library("ember_bpe", SOURCE, ("-O2",))


class NativeMerger:
    """The compiled merge loop bound to one merge table (owned by one BytePairMerger)."""

    SCAN_LENGTH = 256  # longer pieces use the O(n log n) heap merge, also compiled

    def __init__(
        self, library: ctypes.CDLL, table: dict[int, int], byte_ids: list[int | None], id_bits: int
    ) -> None:
        self._library = library
        keys = array("Q", table.keys())
        values = array("Q", table.values())
        keys_address = keys.buffer_info()[0]
        values_address = values.buffer_info()[0]
        self._table = library.ember_table_new(keys_address, values_address, len(keys))
        if not self._table:
            raise MemoryError("could not allocate the native merge table")
        self._byte_ids = (ctypes.c_int64 * 256)(*[-1 if b is None else b for b in byte_ids])
        self._out = (ctypes.c_int64 * self.SCAN_LENGTH)()
        self._values = (ctypes.c_uint64 * self.SCAN_LENGTH)()
        self._id_bits = id_bits
        self._merge = library.ember_merge
        self._merge_long = library.ember_merge_long
        self._merge_ids = library.ember_merge_ids

    def merge(self, data: bytes) -> list[int] | None:
        """Ids of one piece (bytes without a token are skipped); None when scratch memory for
        a long piece cannot be allocated."""
        length = len(data)
        if length <= self.SCAN_LENGTH:
            count = self._merge(
                self._table, self._byte_ids, data, length, self._out, self._values, self._id_bits
            )
            return self._out[:count]
        out = (ctypes.c_int64 * length)()
        count = self._merge_long(self._table, self._byte_ids, data, length, out, self._id_bits)
        return None if count < 0 else out[:count]

    def merge_ids(self, ids: list[int]) -> list[int] | None:
        """The heap merge over symbol ids (not bytes); None when memory runs out."""
        buffer = (ctypes.c_int64 * len(ids))(*ids)
        count = self._merge_ids(self._table, buffer, len(ids), self._id_bits)
        return None if count < 0 else buffer[:count]

    def __del__(self) -> None:
        table = getattr(self, "_table", None)
        if table:
            self._library.ember_table_free(table)
            self._table = None


def load_native(
    table: dict[int, int], byte_ids: list[int | None], id_bits: int
) -> NativeMerger | None:
    """A NativeMerger for this table, or None when the compiled core is unavailable."""
    path = build_library()
    if path is None:
        return None
    try:
        # PyDLL keeps the GIL during calls: the merger's scratch buffers are then never
        # shared by two threads at once.
        library = ctypes.PyDLL(str(path))
        library.ember_table_new.restype = ctypes.c_void_p
        library.ember_table_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        library.ember_table_free.argtypes = [ctypes.c_void_p]
        library.ember_merge.restype = ctypes.c_int64
        library.ember_merge.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
        ]
        library.ember_merge_long.restype = ctypes.c_int64
        library.ember_merge_long.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int64,
        ]
        library.ember_merge_ids.restype = ctypes.c_int64
        library.ember_merge_ids.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
        ]
        return NativeMerger(library, table, byte_ids, id_bits)
    except (OSError, AttributeError, MemoryError):
        return None
