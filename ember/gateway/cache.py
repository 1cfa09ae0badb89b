"""Semantic cache: an answer reused only for the same question, within one scope.

A scope is (tenant, model, endpoint, every request field but the prompt): a tenant never sees
another tenant's answer, and a different temperature, max_tokens or stop list never shares one.
Sampled requests (temperature > 0, or unset, which means 1) are not cached unless the config
says `cache_sampled` or the request sends the header `x-ember-cache: on`.

Lookup is exact first (SHA-256 of the prompt text), then by the prompt's canonical form
(`canonical.py`: case, punctuation, contractions and filler forgotten; numbers, negations,
symbols, acronyms and word order kept), so a hit is never an answer to another question.
Hashing and the canonical form run on a worker thread: a 2 MiB prompt does not hold the event
loop. Each answer is held under both keys; entries expire after `ttl_s` and each scope keeps at
most `max_entries_per_scope` keys (oldest dropped first). With the Redis store the entries live
in Redis, shared by every gateway replica; otherwise in the gateway process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections import OrderedDict
from typing import Protocol

from ember.gateway.canonical import canonical_digest
from ember.gateway.config import CacheConfig

# Fields the prompt text stands for (the Responses API's `instructions` and `input` included) or
# that do not change the answer; every other field is part of the scope.
PROMPT_FIELDS = frozenset({"messages", "prompt", "instructions", "input", "stream", "stream_options", "user"})


@dataclasses.dataclass(frozen=True)
class CachedAnswer:
    """A stored non-streamed OpenAI response body and how it was found: `exact` or `canonical`."""

    response: dict
    match: str = "exact"


@dataclasses.dataclass(frozen=True)
class PromptKeys:
    """The two lookup keys of one prompt."""

    exact: str
    canonical: str

    @staticmethod
    def of(prompt_text: str) -> PromptKeys:
        """The keys of `prompt_text` (CPU-bound for long prompts: callers run it on a worker thread)."""
        return PromptKeys("e:" + hashlib.sha256(prompt_text.encode("utf-8")).hexdigest(), "c:" + canonical_digest(prompt_text))


class CacheEntries(Protocol):
    """Where answers live: `get` the answer under a key of a scope, `put` one under several keys."""

    async def get(self, scope: str, key: str) -> dict | None: ...

    async def put(self, scope: str, keys: tuple[str, ...], response: dict) -> None: ...

    async def close(self) -> None: ...


class SemanticCache:
    """Exact, then canonical-form lookup of answers within a scope (see the module docstring)."""

    def __init__(self, config: CacheConfig, entries: CacheEntries) -> None:
        self._config = config
        self.entries = entries

    def is_eligible(self, body: dict, opted_in: bool) -> bool:
        """Whether this request may be answered from (and stored into) the cache."""
        if not self._config.enabled or (body.get("n") or 1) != 1:
            return False
        temperature = body.get("temperature", 1.0)
        return temperature == 0 or self._config.cache_sampled or opted_in

    @staticmethod
    def scope(tenant: str, model: str, endpoint: str, body: dict) -> str:
        """The scope of a request: a digest of everything but its prompt."""
        settings = {name: value for name, value in body.items() if name not in PROMPT_FIELDS and name != "model"}
        return hashlib.sha256(json.dumps([tenant, model, endpoint, settings], sort_keys=True, default=str).encode()).hexdigest()

    async def lookup(self, scope: str, prompt_text: str) -> CachedAnswer | None:
        """The answer stored for this prompt (exact) or for one with its canonical form, or None."""
        keys = await asyncio.to_thread(PromptKeys.of, prompt_text)
        exact = await self.entries.get(scope, keys.exact)
        if exact is not None:
            return CachedAnswer(exact, "exact")
        canonical = await self.entries.get(scope, keys.canonical)
        return None if canonical is None else CachedAnswer(canonical, "canonical")

    async def store(self, scope: str, prompt_text: str, response: dict) -> None:
        """Hold `response` for this prompt under both of its keys."""
        keys = await asyncio.to_thread(PromptKeys.of, prompt_text)
        await self.entries.put(scope, (keys.exact, keys.canonical), response)


@dataclasses.dataclass
class _Entry:
    response: dict
    expires_at_s: float


class LocalEntries:
    """Entries in this gateway process: an insertion-ordered map per scope, oldest evicted first,
    an expired entry dropped when it is read."""

    def __init__(self, config: CacheConfig, clock=time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._scopes: dict[str, OrderedDict[str, _Entry]] = {}

    async def get(self, scope: str, key: str) -> dict | None:
        entries = self._scopes.get(scope)
        entry = entries.get(key) if entries is not None else None
        if entry is None:
            return None
        if entry.expires_at_s <= self._clock():
            del entries[key]
            return None
        return entry.response

    async def put(self, scope: str, keys: tuple[str, ...], response: dict) -> None:
        entries = self._scopes.setdefault(scope, OrderedDict())
        for key in keys:
            entries[key] = _Entry(response, self._clock() + self._config.ttl_s)
            entries.move_to_end(key)
        while len(entries) > self._config.max_entries_per_scope:
            entries.popitem(last=False)

    async def close(self) -> None:
        self._scopes.clear()


# KEYS: the scope's index (a sorted set of keys by insertion time), then the entries to write.
# ARGV: now (ms), ttl (s), max entries, the response JSON. Expired keys vanish by Redis' EXPIRE;
# the index drops them (and the oldest past the cap) here.
PUT_SCRIPT = """
local now, ttl, cap, value = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl * 1000)
for index = 2, #KEYS do
  redis.call('SET', KEYS[index], value, 'PX', math.floor(ttl * 1000))
  redis.call('ZADD', KEYS[1], now, KEYS[index])
end
local extra = redis.call('ZCARD', KEYS[1]) - cap
if extra > 0 then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, extra - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1)
  redis.call('DEL', unpack(oldest))
end
redis.call('PEXPIRE', KEYS[1], math.floor(ttl * 1000))
return 'ok'
"""


class RedisEntries:
    """Entries in Redis under `namespace:cache:`, shared by every gateway replica on that server."""

    def __init__(self, config: CacheConfig, url: str, namespace: str) -> None:
        import redis.asyncio

        self._config = config
        self._redis = redis.asyncio.Redis.from_url(url, decode_responses=True)
        self._namespace = namespace
        self._put = self._redis.register_script(PUT_SCRIPT)

    async def get(self, scope: str, key: str) -> dict | None:
        value = await self._redis.get(f"{self._namespace}:cache:{scope}:{key}")
        return None if value is None else json.loads(value)

    async def put(self, scope: str, keys: tuple[str, ...], response: dict) -> None:
        names = [f"{self._namespace}:cache-index:{scope}", *(f"{self._namespace}:cache:{scope}:{key}" for key in keys)]
        args = [int(time.time() * 1000), self._config.ttl_s, self._config.max_entries_per_scope, json.dumps(response)]
        await self._put(keys=names, args=args)

    async def close(self) -> None:
        await self._redis.aclose()
