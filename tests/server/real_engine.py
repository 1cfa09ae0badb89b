"""The real engine behind the server's HTTP tests: a tiny random Llama with the SmolLM2 tokenizer, stepping on a
thread of the test process (AsyncEngine), so a test server starts in seconds and answers as `ember serve` does.

Its text is noise, but the same noise at temperature 0: a test compares a reply with the same request answered
another way (streamed and whole, alone and batched, before and after), or holds the model to a given text with
`guided_regex` where it needs one. The only double is `RecordingEngine`, which keeps what reached the engine.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

from ember.engine.async_engine import AsyncEngine
from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.outputs import RequestOutput
from ember.server import ServerConfig, build_app

MODEL = "tiny-model"
# A template whose rendering a test can write out: "<|user|>Hi\n<|assistant|>".
TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
GREEDY = {"temperature": 0}


def tiny_engine(model_dir: Path, tokenizer_dir: Path, max_model_len: int = 256, max_num_seqs: int = 8) -> AsyncEngine:
    """The tiny model served with `max_model_len` tokens of context and `max_num_seqs` running at once."""
    config = EngineConfig(model=str(model_dir), tokenizer=str(tokenizer_dir), dtype="float32", max_model_len=max_model_len,
                          cache=CacheConfig(block_size=16), scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))  # fmt: skip
    return AsyncEngine(config, show_progress=False)


def tiny_app(engine, **settings):
    """An app over `engine` serving it as MODEL with TEMPLATE (unless `settings` say otherwise)."""
    return build_app(engine, ServerConfig(**{"served_model_names": [MODEL], "chat_template": TEMPLATE, **settings}))


class RecordingEngine:
    """The real engine, keeping what the server handed it: each EngineRequest (`requests`, by id) and each abort it
    asked for (`aborted`). No logic of its own: every call goes on to the engine unchanged."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.requests: dict[str, EngineRequest] = {}
        self.aborted: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        stream = self.engine.generate(request)
        self.requests[request.request_id] = request
        return stream

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.engine.abort(request_id)

    def only(self, prefix: str) -> EngineRequest:
        """The one request whose id starts with `prefix`."""
        (found,) = [request for request_id, request in self.requests.items() if request_id.startswith(prefix)]
        return found


def wait_until_idle(engine, timeout_s: float = 10.0) -> bool:
    """Whether the engine runs and holds nothing (within `timeout_s`): every request finished or aborted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks:
            return True
        time.sleep(0.02)
    return False


def replace_config(engine: AsyncEngine, **fields) -> EngineConfig:
    """The engine's config with `fields` changed (another engine of the same model)."""
    return dataclasses.replace(engine.engine.config, **fields)
