"""One JSON line per request: who (key name, tenant, never the key), what, where, how long,
how many tokens and what it cost. Prompts appear only when `observability.log_prompts`."""

from __future__ import annotations

import json
import logging

logger = logging.getLogger("ember.gateway.requests")


class RequestLogger:
    def __init__(self, log_prompts: bool) -> None:
        self.log_prompts = log_prompts

    def log(self, record: dict, prompt: str | None = None) -> None:
        if self.log_prompts and prompt is not None:
            record = {**record, "prompt": prompt}
        logger.info(json.dumps(record, sort_keys=True))
