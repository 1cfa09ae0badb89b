"""The server's own settings: where it listens, how much it admits, what it calls the model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ember.engine.data_parallel_config import DataParallelConfig
from ember.engine.sampling_defaults import SamplingDefaults
from ember.server.openai.reasoning import REASONING_PARSERS

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# vLLM's --tool-call-parser names of the formats a reply's calls are read in (Qwen2.5 / Qwen3 and Hermes templates write
# Hermes's tags): ember.server.openai.tool_calls reads each of them in any reply, so naming one changes nothing.
TOOL_CALL_FORMATS = ("hermes", "mistral", "llama3_json")


@dataclass
class ServerConfig:
    """Validated settings of one HTTP server in front of one engine.

    `max_waiting` bounds how many requests may wait for their first token at once;
    one more is answered 503 with `Retry-After: retry_after_s`. `served_model_names`
    are the ids clients may send as `model` (empty: the engine's own model name).
    `log_prompts` adds prompt text to the per-request log line (off: ids and counts only).
    `trust_request_chat_template` lets a chat request bring its own template (`chat_template`).
    `sampling_defaults` fill the sampling fields a request leaves out (the model's generation config, as vLLM's).

    Slow clients: a connection has `header_timeout_s` to send a request's headers (from when it
    opens, or from the end of its previous response) and `body_timeout_s` from then to send the
    whole body (408 beyond). Shutdown: on SIGTERM running requests get `drain_timeout_s` to
    finish while new ones are refused (503 + Retry-After); see `ember.server.common.drain`.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_waiting: int = 256
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    served_model_names: list[str] = field(default_factory=list)
    retry_after_s: int = 1
    log_prompts: bool = False
    log_requests: bool = True  # one line per finished request (off: vLLM's --disable-log-requests)
    uvicorn_log_level: str = "info"
    reasoning_parser: str | None = None  # one of ember.server.openai.reasoning.REASONING_PARSERS: reasoning apart from content
    chat_template: str | None = None
    trust_request_chat_template: bool = False
    enable_debug_endpoints: bool = True
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    # how often a whole-answer request checks that its client is still there (a gone client's request is aborted)
    disconnect_poll_s: float = 0.5
    api_keys: tuple[str, ...] = ()  # none: the /v1 routes are open; else a request must bring one (ember.server.common.api_key)
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)  # fields a request leaves out
    # Responses API: where finished responses are kept for previous_response_id (SQLite; ":memory:" lasts as long as
    # the server), and how many at most (the oldest go first; 0: none is kept).
    responses_store: str = ":memory:"
    max_stored_responses: int = 10_000
    lora_modules: dict[str, str] = field(default_factory=dict)  # adapter name clients send as 'model' -> its folder
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's env flag)
    data_parallel: DataParallelConfig = field(default_factory=DataParallelConfig)  # engine replicas behind this API

    def __post_init__(self) -> None:
        self.served_model_names = list(self.served_model_names)
        self.api_keys = tuple(self.api_keys)
        if any(not key or key != key.strip() for key in self.api_keys):
            raise ValueError("--api-key must be a non-empty key without surrounding spaces")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser {self.reasoning_parser!r}: choose one of {', '.join(REASONING_PARSERS)}")
        if self.uvicorn_log_level not in UVICORN_LOG_LEVELS:
            raise ValueError(f"--uvicorn-log-level {self.uvicorn_log_level!r}: choose one of {', '.join(UVICORN_LOG_LEVELS)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"server port must be from 0 to 65535, got {self.port}")
        if self.max_waiting < 1:
            raise ValueError(f"--max-waiting must be at least 1, got {self.max_waiting}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be at least 1024, got {self.max_body_bytes}")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s must be at least 1, got {self.retry_after_s}")
        for flag, value in (
            ("--header-timeout-s", self.header_timeout_s),
            ("--body-timeout-s", self.body_timeout_s),
            ("--drain-timeout-s", self.drain_timeout_s),
            ("disconnect_poll_s", self.disconnect_poll_s),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{flag} must be a positive, finite number of seconds, got {value}")
        if self.max_stored_responses < 0:
            raise ValueError(f"--max-stored-responses must be at least 0, got {self.max_stored_responses}")
        if any(not name for name in self.served_model_names):
            raise ValueError("--served-model-name values must be non-empty")
