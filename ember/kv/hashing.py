"""Chained hashes of full KV blocks: a block's key names every token before it too."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROOT_HASH = b"ember-kv-root"


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> bytes:
    """Key of a full block: its parent's key, its token ids, and extra keys (adapter, cache salt)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent_hash or ROOT_HASH)
    digest.update(array("q", token_ids).tobytes())
    if extra_keys:
        digest.update(repr(extra_keys).encode())
    return digest.digest()


def hash_blocks(token_ids: Sequence[int], block_size: int, extra_keys: tuple = (), parent: bytes | None = None) -> list[bytes]:
    """Chained keys of every full block of `token_ids`, in order."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], extra_keys)
        hashes.append(parent)
    return hashes
