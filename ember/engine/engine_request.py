"""EngineRequest: one request as a client hands it to the engine, whole, from the API to the scheduler."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from ember.engine.lora_request import LoRARequest
from ember.engine.rejection import RequestRejected, check
from ember.engine.sampling_params import SamplingParams

MAX_CACHE_SALT_CHARS = 1024


@dataclass(frozen=True)
class EngineRequest:
    """What one request asks of the engine; checked on construction (RequestRejected names the field).

    It travels unchanged from the API (server, `ember.llm`) through `EngineClient.generate`, the engine
    process's message and `LLMEngine.add_request` into the scheduler's `Request`: a new request field is
    added here and read where it is used, nothing in between. What depends on the engine (its vocabulary,
    context window, KV cache) is checked by `RequestLimits.check`.

    `priority`: lower runs first (then arrival order), as vLLM's priority scheduling.
    `cache_salt`: mixed into its KV blocks' prefix-cache keys, so cached prefixes are shared only with
    requests of the same salt. `lora_request`: the LoRA adapter it runs with (None: the base model); its id joins
    the prefix-cache keys, so two adapters never share KV blocks. `prompt`: the prompt's text when it was text (echoed back in outputs).
    The output constraint (`params.structured_output`) stays in SamplingParams, where vLLM's LLM takes it.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.request_id, str) and bool(self.request_id), "request_id", "a non-empty string")
        check(isinstance(self.params, SamplingParams), "params", "a SamplingParams")
        ids = self.prompt_token_ids
        ids = ids.tolist() if hasattr(ids, "tolist") else ids  # numpy / torch ids
        check(not isinstance(ids, str | bytes), "prompt", "a list of token ids")
        wrong = next((t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0), None)
        if wrong is not None:
            raise RequestRejected(f"a prompt is a list of non-negative integer token ids; {wrong!r} in it is not a token id", "prompt")
        check(len(ids) > 0, "prompt", "at least one token (the prompt is empty)")
        object.__setattr__(self, "prompt_token_ids", [int(t) for t in ids])
        check(isinstance(self.priority, int) and not isinstance(self.priority, bool), "priority", "an integer (lower runs first)")
        if self.cache_salt is not None:
            check(isinstance(self.cache_salt, str) and 0 < len(self.cache_salt) <= MAX_CACHE_SALT_CHARS, "cache_salt",
                  f"a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters")
        check(self.lora_request is None or isinstance(self.lora_request, LoRARequest), "lora_request", "a LoRARequest or None")

    @property
    def cache_keys(self) -> tuple:
        """The extra keys of its blocks' prefix-cache hashes."""
        salt = () if self.cache_salt is None else (self.cache_salt,)
        return salt if self.lora_request is None else (*salt, self.lora_request.cache_key)
