"""Everything the route handlers of one app share, built once by `build_app`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.engine.lora_request import LoRARequest
from ember.server.common.admission import AdmissionGate
from ember.server.common.drain import Drain
from ember.server.common.metrics import ServerMetrics
from ember.server.common.request_log import RequestLogger
from ember.server.config import ServerConfig
from ember.server.openai.chat_template import ChatTemplate, RequestTemplates
from ember.server.openai.prompt_encoding import PromptEncoder
from ember.server.serving.response_store import ResponseStore


@dataclass
class ServingContext:
    """One server's engine, settings, model ids, chat template (and those requests bring), prompt encoder,
    admission gate, shutdown drain, metrics, log and stored responses. `model_names` holds the base model's ids,
    then the adapters' names (`adapters`: the LoRA adapter a request naming one runs with)."""

    engine: object
    config: ServerConfig
    model_names: list[str]
    chat_template: ChatTemplate | None
    request_templates: RequestTemplates
    encoder: PromptEncoder
    admission: AdmissionGate
    drain: Drain
    metrics: ServerMetrics
    request_logger: RequestLogger
    created_time: int
    response_store: ResponseStore
    adapters: dict[str, LoRARequest] = field(default_factory=dict)

    @property
    def tokenizer(self):
        """The engine's tokenizer."""
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        """The engine's context window in tokens."""
        return self.engine.max_model_len
