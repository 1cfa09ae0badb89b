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

from ember.gateway.config import KeyConfig

WINDOW_S = 60
BUDGET_RETRY_AFTER_S = 1  # a budget held by requests in flight frees up as they settle, typically within seconds
# The largest amount a store holds exactly: Redis' Lua numbers are doubles, exact to 2**53.
MAX_RESERVATION = 2**53 - 1


class InvalidReservation(ValueError):
    """A reservation no request can need: a non-integer, a non-positive token count, a negative
    or an absurd cost. The gateway refuses such requests at the door; the stores refuse them again
    whatever the caller, so no arithmetic on a key's totals ever meets one."""


def check_reservation(tokens: object, cost_nano_usd: object) -> None:
    """Raise InvalidReservation unless `tokens` is an int in [1, MAX_RESERVATION] and
    `cost_nano_usd` one in [0, MAX_RESERVATION] (a free model's requests cost 0)."""
    for name, value, least in (("tokens", tokens, 1), ("cost_nano_usd", cost_nano_usd, 0)):
        if type(value) is not int or not least <= value <= MAX_RESERVATION:
            raise InvalidReservation(f"a reservation's {name} must be an integer in [{least}, {MAX_RESERVATION}], got {value!r}")


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
        """Hold `tokens` and `cost` for a request if the key's limits allow it, atomically; InvalidReservation for
        amounts `check_reservation` refuses."""

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
    """The Denial for a limit named by the store: 'budget' (requests in flight hold part of the budget: retry once
    they settle), 'budget_spent' (what was spent already leaves no room: no retry can succeed), 'rpm' or 'tpm'."""
    if reason == "budget":
        return Denial(
            "budget_exceeded",
            f"key {key.name!r} has no budget left for this request while others are in flight (its max_tokens included); "
            "retry when they finish, or lower max_tokens", BUDGET_RETRY_AFTER_S,
        )  # fmt: skip
    if reason == "budget_spent":
        return Denial(
            "budget_exceeded",
            f"key {key.name!r} has exhausted its budget: what it spent leaves no room for this request (its max_tokens "
            "included); no retry will succeed until the budget is raised (or with a lower max_tokens)",
        )  # fmt: skip
    limit = key.rpm if reason == "rpm" else key.tpm
    what = "requests" if reason == "rpm" else "tokens (prompt bound + max_tokens)"
    return Denial(
        "rate_limit_exceeded",
        f"key {key.name!r} would exceed {limit} {what} per minute; retry later or lower max_tokens",
        seconds_to_next_window(now_s),
    )


def budget_refusal(key: KeyConfig, committed_nano_usd: int, spent_nano_usd: int, cost_nano_usd: int) -> str | None:
    """'budget_spent' or 'budget' when the key's budget cannot hold `cost_nano_usd` more, else None."""
    if key.budget_nano_usd is None or committed_nano_usd + cost_nano_usd <= key.budget_nano_usd:
        return None
    return "budget_spent" if spent_nano_usd + cost_nano_usd > key.budget_nano_usd else "budget"
