"""The gateway's shared state: per-key spend and tokens, rate windows, revocations, the ledger.

Every admission is one atomic reservation: check the budget, RPM and TPM and add the request's
upper-bound tokens and cost in the same transaction (SQLite `BEGIN IMMEDIATE`, a Redis Lua
script), so concurrent requests on any number of gateway replicas can never together pass a
limit. Settling replaces the reservation with what the request really used and writes one
ledger row; a key's totals always equal the sum of its ledger rows.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ember.gateway.config import KeyConfig, StoreConfig

WINDOW_S = 60


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Tokens and money held for one request in the rate window it started in."""

    request_id: str
    key_sha256: str
    window: int
    tokens: int
    cost_nano_usd: int


@dataclasses.dataclass(frozen=True)
class Denial:
    """Why a request was refused before it ran: `code` is rate_limit_exceeded or budget_exceeded."""

    code: str
    message: str
    retry_after_s: int | None = None


@dataclasses.dataclass(frozen=True)
class LedgerRow:
    """What one request used and cost; `status` is ok, cancelled, failed or cached."""

    request_id: str
    key_sha256: str
    model: str
    window: int
    prompt_tokens: int
    completion_tokens: int
    cost_nano_usd: int
    status: str


@dataclasses.dataclass(frozen=True)
class KeyTotals:
    """Running totals of one key; `committed` includes requests still in flight."""

    committed_nano_usd: int = 0
    spent_nano_usd: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0


class Store(Protocol):
    async def reserve(self, key: KeyConfig, request_id: str, tokens: int, cost_nano_usd: int, now_s: float) -> Reservation | Denial:
        """Hold `tokens` and `cost` for a request if the key's limits allow it, atomically."""

    async def settle(self, reservation: Reservation, row: LedgerRow) -> None:
        """Replace a reservation by what the request used, and record it."""

    async def revoke(self, key_sha256: str) -> None: ...

    async def is_revoked(self, key_sha256: str) -> bool: ...

    async def totals(self, key_sha256: str) -> KeyTotals: ...

    async def window_totals(self, key_sha256: str, window: int) -> tuple[int, int]:
        """(requests, committed tokens) of a key in one rate window."""

    async def ledger(self, key_sha256: str) -> list[LedgerRow]: ...

    async def close(self) -> None: ...


def window_of(now_s: float) -> int:
    """The fixed one-minute rate window a wall-clock time falls in."""
    return int(now_s // WINDOW_S)


def seconds_to_next_window(now_s: float) -> int:
    return max(1, int(WINDOW_S - now_s % WINDOW_S) + 1)


def denial_for(key: KeyConfig, reason: str, now_s: float) -> Denial:
    """The Denial for a limit named by the store ('budget', 'rpm', 'tpm')."""
    if reason == "budget":
        return Denial("budget_exceeded", f"key {key.name!r} has no budget left for this request (its max_tokens included)")
    limit = key.rpm if reason == "rpm" else key.tpm
    what = "requests" if reason == "rpm" else "tokens (prompt bound + max_tokens)"
    return Denial(
        "rate_limit_exceeded",
        f"key {key.name!r} would exceed {limit} {what} per minute; retry later or lower max_tokens",
        seconds_to_next_window(now_s),
    )


def open_store(config: StoreConfig) -> Store:
    """The store the config names."""
    if config.kind == "redis":
        from ember.gateway.redis_store import RedisStore

        return RedisStore(config.url, config.namespace)
    from ember.gateway.sqlite_store import SQLiteStore

    return SQLiteStore(config.path)
