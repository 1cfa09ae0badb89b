"""A small deterministic text embedding for the semantic cache, with no model to download.

Lower-cased words and character trigrams are hashed (signed) into a fixed number of dimensions
and the vector is L2-normalised, so cosine similarity is a dot product. Texts that differ in
case, punctuation or a word or two land close together; different questions do not. It is
not a neural sentence embedding: paraphrases with no words in common are not matched.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

DIMENSIONS = 512
_WORD = re.compile(r"\w+")


def embed(text: str, dimensions: int = DIMENSIONS) -> np.ndarray:
    """The unit-norm embedding of `text` (all zeros for text with no word characters)."""
    vector = np.zeros(dimensions, dtype=np.float32)
    words = _WORD.findall(text.lower())
    features = [f"w:{word}" for word in words]
    joined = " ".join(words)
    features += [f"c:{joined[index:index + 3]}" for index in range(max(0, len(joined) - 2))]
    for feature in features:
        digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector
