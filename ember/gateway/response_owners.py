"""Which backend stored each Responses API response that passed through this gateway.

A server keeps the responses it answered (ember serve, OpenAI), so a request continuing one (`previous_response_id`)
and a read of one (`GET /v1/responses/{id}`) must reach that server, not whichever the model's routing picks. The map
is this process's own and bounded (the newest kept); each entry also names the tenant whose key made the response,
and only that tenant may read or delete it through the gateway.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

MAX_REMEMBERED = 100_000


@dataclass(frozen=True)
class ResponseOwner:
    backend: str
    tenant: str


class ResponseOwners:
    """Response id -> the backend that stored it and the tenant that asked, at most `max_entries` (oldest forgotten)."""

    def __init__(self, max_entries: int = MAX_REMEMBERED) -> None:
        self._max_entries = max_entries
        self._owners: OrderedDict[str, ResponseOwner] = OrderedDict()

    def remember(self, response_id: object, backend: str, tenant: str) -> None:
        if not isinstance(response_id, str) or not response_id:
            return
        self._owners[response_id] = ResponseOwner(backend, tenant)
        self._owners.move_to_end(response_id)
        while len(self._owners) > self._max_entries:
            self._owners.popitem(last=False)

    def owner(self, response_id: object) -> ResponseOwner | None:
        return self._owners.get(response_id) if isinstance(response_id, str) else None

    def forget(self, response_id: str) -> None:
        self._owners.pop(response_id, None)
