"""The Redis store, for several gateway replicas: reservation and settlement are Lua scripts,
which Redis runs atomically, so the check and the increment of a limit can never interleave
with another replica's."""

from __future__ import annotations

import json

from ember.gateway.config import KeyConfig
from ember.gateway.store import (
    WINDOW_S,
    Denial,
    KeyTotals,
    LedgerRow,
    Reservation,
    check_reservation,
    denial_for,
    window_of,
)

# KEYS: totals hash, window hash. ARGV: cost, tokens, budget, rpm, tpm (-1: no limit), window ttl.
RESERVE_SCRIPT = """
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed_nano_usd') or '0')
local requests = tonumber(redis.call('HGET', KEYS[2], 'requests') or '0')
local tokens = tonumber(redis.call('HGET', KEYS[2], 'tokens') or '0')
local cost, want, budget, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_nano_usd') or '0')
if budget >= 0 and committed + cost > budget then
  if spent + cost > budget then return 'budget_spent' end
  return 'budget'
end
if rpm >= 0 and requests + 1 > rpm then return 'rpm' end
if tpm >= 0 and tokens + want > tpm then return 'tpm' end
redis.call('HINCRBY', KEYS[1], 'committed_nano_usd', cost)
redis.call('HINCRBY', KEYS[2], 'requests', 1)
redis.call('HINCRBY', KEYS[2], 'tokens', want)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
return 'ok'
"""

# KEYS: totals hash, window hash, ledger list. ARGV: cost delta, cost, prompt, completion, token delta, row json.
SETTLE_SCRIPT = """
redis.call('HINCRBY', KEYS[1], 'committed_nano_usd', tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[1], 'spent_nano_usd', tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[1], 'prompt_tokens', tonumber(ARGV[3]))
redis.call('HINCRBY', KEYS[1], 'completion_tokens', tonumber(ARGV[4]))
redis.call('HINCRBY', KEYS[1], 'requests', 1)
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HINCRBY', KEYS[2], 'tokens', tonumber(ARGV[5])) end
redis.call('RPUSH', KEYS[3], ARGV[6])
return 'ok'
"""


class RedisStore:
    """All keys live under `namespace:` so several gateways (or tests) can share one server."""

    def __init__(self, url: str, namespace: str) -> None:
        import redis.asyncio

        self._redis = redis.asyncio.Redis.from_url(url, decode_responses=True)
        self._namespace = namespace
        self._reserve = self._redis.register_script(RESERVE_SCRIPT)
        self._settle = self._redis.register_script(SETTLE_SCRIPT)

    def _key(self, *parts: object) -> str:
        return ":".join((self._namespace, *map(str, parts)))

    async def reserve(self, key: KeyConfig, request_id: str, tokens: int, cost_nano_usd: int, now_s: float) -> Reservation | Denial:
        check_reservation(tokens, cost_nano_usd)
        window = window_of(now_s)
        limits = [-1 if limit is None else limit for limit in (key.budget_nano_usd, key.rpm, key.tpm)]
        outcome = await self._reserve(
            keys=[self._key("totals", key.key_sha256), self._key("window", key.key_sha256, window)],
            args=[cost_nano_usd, tokens, *limits, 2 * WINDOW_S],
        )
        if outcome != "ok":
            return denial_for(key, outcome, now_s)
        return Reservation(request_id, key.key_sha256, window, tokens, cost_nano_usd)

    async def settle(self, reservation: Reservation, row: LedgerRow) -> None:
        await self._settle(
            keys=[
                self._key("totals", row.key_sha256),
                self._key("window", row.key_sha256, reservation.window),
                self._key("ledger", row.key_sha256),
            ],
            args=[
                row.cost_nano_usd - reservation.cost_nano_usd,
                row.cost_nano_usd,
                row.prompt_tokens,
                row.completion_tokens,
                row.prompt_tokens + row.completion_tokens - reservation.tokens,
                json.dumps(row.__dict__),
            ],
        )

    async def revoke(self, key_sha256: str) -> None:
        await self._redis.sadd(self._key("revoked"), key_sha256)

    async def is_revoked(self, key_sha256: str) -> bool:
        return bool(await self._redis.sismember(self._key("revoked"), key_sha256))

    async def totals(self, key_sha256: str) -> KeyTotals:
        values = await self._redis.hgetall(self._key("totals", key_sha256))
        return KeyTotals(**{name: int(value) for name, value in values.items()})

    async def window_totals(self, key_sha256: str, window: int) -> tuple[int, int]:
        values = await self._redis.hgetall(self._key("window", key_sha256, window))
        return int(values.get("requests", 0)), int(values.get("tokens", 0))

    async def ledger(self, key_sha256: str) -> list[LedgerRow]:
        rows = await self._redis.lrange(self._key("ledger", key_sha256), 0, -1)
        return [LedgerRow(**json.loads(row)) for row in rows]

    async def close(self) -> None:
        await self._redis.aclose()
