"""One structured log line per finished request: ids, token counts, latencies, finish reason."""

from __future__ import annotations

import json
import logging

from ember.server.common.metrics import FinishedRequest

logger = logging.getLogger("ember.server.requests")


class RequestLogger:
    """Writes `finished request_id=... prompt_tokens=... ...` lines (logfmt).

    Prompt text is left out unless `log_prompts`, since prompts may hold user data.
    """

    def __init__(self, log_prompts: bool = False, enabled: bool = True) -> None:
        self._log_prompts = log_prompts
        self._enabled = enabled

    def log_finished(self, finished: FinishedRequest, prompt_text: str | None = None) -> None:
        """Log one finished (or aborted) request (nothing when disabled: vLLM's --disable-log-requests)."""
        if not self._enabled:
            return
        fields = {
            "request_id": finished.request_id,
            "prompt_tokens": finished.prompt_tokens,
            "completion_tokens": finished.completion_tokens,
            "cached_tokens": finished.cached_tokens,
            "ttft_s": _seconds(finished.time_to_first_token_s),
            "tpot_s": _seconds(finished.time_per_output_token_s),
            "latency_s": _seconds(finished.latency_s),
            "finish_reason": finished.finish_reason,
        }
        if self._log_prompts and prompt_text is not None:
            fields["prompt"] = json.dumps(prompt_text, ensure_ascii=False)
        logger.info("finished %s", " ".join(f"{key}={value}" for key, value in fields.items()))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
