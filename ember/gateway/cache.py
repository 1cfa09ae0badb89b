"""Semantic cache: answers reused for the same or a near-identical prompt, within one scope.

A scope is (tenant, model, endpoint, every request field but the prompt): a tenant never sees
another tenant's answer, and a different temperature, max_tokens or stop list never shares one.
Sampled requests (temperature > 0, or unset, which means 1) are not cached unless the config
says `cache_sampled` or the request sends the header `x-ember-cache: on`. Lookup is exact
(hash of the prompt text) first, then the most similar entry by embedding cosine if it clears
the threshold. Entries expire after `ttl_s`; each scope keeps at most `max_entries_per_scope`
(oldest dropped first). The cache lives in the gateway process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import OrderedDict

import numpy as np

from ember.gateway.config import CacheConfig
from ember.gateway.embedding import embed

# Fields the prompt text stands for (the Responses API's `instructions` and `input` included) or
# that do not change the answer; every other field is part of the scope.
PROMPT_FIELDS = frozenset({"messages", "prompt", "instructions", "input", "stream", "stream_options", "user"})


@dataclasses.dataclass(frozen=True)
class CachedAnswer:
    """A stored non-streamed OpenAI response body and the similarity it was found with."""

    response: dict
    similarity: float = 1.0


@dataclasses.dataclass
class _Entry:
    embedding: np.ndarray
    response: dict
    expires_at_s: float


class SemanticCache:
    def __init__(self, config: CacheConfig, clock=time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._scopes: dict[str, OrderedDict[str, _Entry]] = {}

    def is_eligible(self, body: dict, opted_in: bool) -> bool:
        """Whether this request may be answered from (and stored into) the cache."""
        if not self._config.enabled or int(body.get("n") or 1) != 1:
            return False
        temperature = body.get("temperature", 1.0)
        return temperature == 0 or self._config.cache_sampled or opted_in

    @staticmethod
    def scope(tenant: str, model: str, endpoint: str, body: dict) -> str:
        settings = {name: value for name, value in body.items() if name not in PROMPT_FIELDS and name != "model"}
        return json.dumps([tenant, model, endpoint, settings], sort_keys=True, default=str)

    def lookup(self, scope: str, prompt_text: str) -> CachedAnswer | None:
        entries = self._live_entries(scope)
        exact = entries.get(_digest(prompt_text))
        if exact is not None:
            return CachedAnswer(exact.response)
        if not entries:
            return None
        query = embed(prompt_text)
        best_similarity, best = max(((float(entry.embedding @ query), entry) for entry in entries.values()), key=lambda pair: pair[0])
        if best_similarity >= self._config.similarity_threshold:
            return CachedAnswer(best.response, best_similarity)
        return None

    def store(self, scope: str, prompt_text: str, response: dict) -> None:
        entries = self._scopes.setdefault(scope, OrderedDict())
        entries[_digest(prompt_text)] = _Entry(embed(prompt_text), response, self._clock() + self._config.ttl_s)
        entries.move_to_end(_digest(prompt_text))
        while len(entries) > self._config.max_entries_per_scope:
            entries.popitem(last=False)

    def _live_entries(self, scope: str) -> OrderedDict[str, _Entry]:
        entries = self._scopes.get(scope)
        if entries is None:
            return OrderedDict()
        now = self._clock()
        for digest in [digest for digest, entry in entries.items() if entry.expires_at_s <= now]:
            del entries[digest]
        return entries


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
