"""The SQLite store: the default for one gateway (several processes on one host also work,
since each reservation is a `BEGIN IMMEDIATE` transaction holding the database's write lock)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from ember.gateway.config import KeyConfig
from ember.gateway.store import (
    Denial,
    KeyTotals,
    LedgerRow,
    Reservation,
    budget_refusal,
    check_reservation,
    denial_for,
    window_of,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS key_totals (
    key_sha256 TEXT PRIMARY KEY, committed_nano_usd INTEGER NOT NULL DEFAULT 0,
    spent_nano_usd INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS rate_windows (
    key_sha256 TEXT NOT NULL, window INTEGER NOT NULL, requests INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key_sha256, window));
CREATE TABLE IF NOT EXISTS revoked_keys (key_sha256 TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS ledger (
    request_id TEXT PRIMARY KEY, key_sha256 TEXT NOT NULL, model TEXT NOT NULL, window INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_nano_usd INTEGER NOT NULL,
    status TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ledger_by_key ON ledger (key_sha256);
"""


class SQLiteStore:
    """One connection used from worker threads, one statement batch at a time."""

    def __init__(self, path: str) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._connection.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit survives a crash of the gateway; only a power cut can lose the
        # last commits. FULL would fsync twice per request on the hot path.
        self._connection.execute("PRAGMA synchronous=NORMAL")
        self._connection.executescript(SCHEMA)
        self._lock = threading.Lock()

    async def reserve(self, key: KeyConfig, request_id: str, tokens: int, cost_nano_usd: int, now_s: float) -> Reservation | Denial:
        check_reservation(tokens, cost_nano_usd)
        window = window_of(now_s)
        reason = await self._run(self._reserve, key, window, tokens, cost_nano_usd)
        if reason is not None:
            return denial_for(key, reason, now_s)
        return Reservation(request_id, key.key_sha256, window, tokens, cost_nano_usd)

    def _reserve(self, db: sqlite3.Connection, key: KeyConfig, window: int, tokens: int, cost: int) -> str | None:
        committed, spent = db.execute(
            "SELECT committed_nano_usd, spent_nano_usd FROM key_totals WHERE key_sha256 = ?", (key.key_sha256,)
        ).fetchone() or (0, 0)
        used = db.execute(
            "SELECT requests, tokens FROM rate_windows WHERE key_sha256 = ? AND window = ?", (key.key_sha256, window)
        ).fetchone() or (0, 0)
        refusal = budget_refusal(key, committed, spent, cost)
        if refusal is not None:
            return refusal
        if key.rpm is not None and used[0] + 1 > key.rpm:
            return "rpm"
        if key.tpm is not None and used[1] + tokens > key.tpm:
            return "tpm"
        db.execute(
            "INSERT INTO key_totals (key_sha256, committed_nano_usd) VALUES (?, ?) ON CONFLICT (key_sha256) "
            "DO UPDATE SET committed_nano_usd = committed_nano_usd + excluded.committed_nano_usd",
            (key.key_sha256, cost),
        )
        db.execute(
            "INSERT INTO rate_windows (key_sha256, window, requests, tokens) VALUES (?, ?, 1, ?) "
            "ON CONFLICT (key_sha256, window) DO UPDATE SET requests = requests + 1, tokens = tokens + excluded.tokens",
            (key.key_sha256, window, tokens),
        )
        return None

    async def settle(self, reservation: Reservation, row: LedgerRow) -> None:
        await self._run(self._settle, reservation, row)

    def _settle(self, db: sqlite3.Connection, reservation: Reservation, row: LedgerRow) -> None:
        db.execute(
            "INSERT INTO key_totals (key_sha256) VALUES (?) ON CONFLICT (key_sha256) DO NOTHING", (row.key_sha256,)
        )
        db.execute(
            "UPDATE key_totals SET committed_nano_usd = committed_nano_usd + ?, spent_nano_usd = spent_nano_usd + ?, "
            "prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ?, requests = requests + 1 "
            "WHERE key_sha256 = ?",
            (row.cost_nano_usd - reservation.cost_nano_usd, row.cost_nano_usd, row.prompt_tokens, row.completion_tokens, row.key_sha256),
        )
        db.execute(
            "UPDATE rate_windows SET tokens = tokens + ? WHERE key_sha256 = ? AND window = ?",
            (row.prompt_tokens + row.completion_tokens - reservation.tokens, row.key_sha256, reservation.window),
        )
        db.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (row.request_id, row.key_sha256, row.model, row.window, row.prompt_tokens, row.completion_tokens, row.cost_nano_usd, row.status),
        )

    async def revoke(self, key_sha256: str) -> None:
        await self._run(lambda db: db.execute("INSERT OR IGNORE INTO revoked_keys VALUES (?)", (key_sha256,)))

    async def is_revoked(self, key_sha256: str) -> bool:
        row = await self._run(lambda db: db.execute("SELECT 1 FROM revoked_keys WHERE key_sha256 = ?", (key_sha256,)).fetchone())
        return row is not None

    async def totals(self, key_sha256: str) -> KeyTotals:
        row = await self._run(
            lambda db: db.execute(
                "SELECT committed_nano_usd, spent_nano_usd, prompt_tokens, completion_tokens, requests "
                "FROM key_totals WHERE key_sha256 = ?",
                (key_sha256,),
            ).fetchone()
        )
        return KeyTotals(*row) if row else KeyTotals()

    async def window_totals(self, key_sha256: str, window: int) -> tuple[int, int]:
        row = await self._run(
            lambda db: db.execute(
                "SELECT requests, tokens FROM rate_windows WHERE key_sha256 = ? AND window = ?", (key_sha256, window)
            ).fetchone()
        )
        return tuple(row) if row else (0, 0)

    async def ledger(self, key_sha256: str) -> list[LedgerRow]:
        rows = await self._run(
            lambda db: db.execute("SELECT * FROM ledger WHERE key_sha256 = ? ORDER BY rowid", (key_sha256,)).fetchall()
        )
        return [LedgerRow(*row) for row in rows]

    async def close(self) -> None:
        await self._run(lambda db: None)
        self._connection.close()

    async def _run(self, function, *args):
        """Run `function(db, *args)` in one immediate transaction on a worker thread."""
        return await asyncio.to_thread(self._transaction, function, *args)

    def _transaction(self, function, *args):
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                result = function(self._connection, *args)
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")
            return result
