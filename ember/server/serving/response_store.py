"""Finished Responses API responses, kept so a later request can continue them (`previous_response_id`) and
clients can read them back (`GET /v1/responses/{id}`, its input items) or delete them.

A response is stored with the input items it answered (those it inherited from the response it continued
included, its instructions not: OpenAI does not carry instructions over), so continuing it replays the whole
conversation. The store is SQLite (`:memory:` by default, or a file that outlives the server) holding at most
`max_responses`: past that the oldest go first, so memory and disk stay bounded however long the server runs.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    """A stored response object (as JSON data) and the input items it answered."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]

    def conversation(self) -> list[dict[str, Any]]:
        """Its input items then its output items: the history a response continuing it starts from."""
        return [*self.input_items, *self.response["output"]]


class ResponseStore:
    """Responses by id in SQLite, the newest `max_responses` kept (0: none is stored)."""

    def __init__(self, path: str = ":memory:", max_responses: int = 10_000) -> None:
        if max_responses < 0:
            raise ValueError(f"--max-stored-responses must be at least 0, got {max_responses}")
        self.max_responses = max_responses
        self._lock = threading.Lock()  # one connection, used from the event loop and test threads alike
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "id TEXT UNIQUE NOT NULL, response TEXT NOT NULL, input_items TEXT NOT NULL)")  # fmt: skip
        self._db.commit()

    @property
    def enabled(self) -> bool:
        return self.max_responses > 0

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        """Keep `response` (JSON data with an `id`) and its input items; the oldest beyond the cap are dropped."""
        if not self.enabled:
            return
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses (id, response, input_items) VALUES (?, ?, ?)",
                             (response["id"], json.dumps(response), json.dumps(input_items)))  # fmt: skip
            self._db.execute("DELETE FROM responses WHERE seq NOT IN (SELECT seq FROM responses ORDER BY seq DESC LIMIT ?)",
                             (self.max_responses,))  # fmt: skip
            self._db.commit()

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute("SELECT response, input_items FROM responses WHERE id = ?", (response_id,)).fetchone()
        return None if row is None else StoredResponse(json.loads(row[0]), json.loads(row[1]))

    def delete(self, response_id: str) -> bool:
        """Forget a response; whether there was one."""
        with self._lock:
            deleted = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
            self._db.commit()
        return deleted > 0

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
