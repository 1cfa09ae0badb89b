"""RequestLimits: what a request may ask of one engine, checked in one place.

`EngineRequest` and `SamplingParams` check their own fields on construction; what depends on the engine
(its vocabulary, context window, KV cache, step budget, whether it has a tokenizer) is checked here, once
per request, by whoever hands it to the engine: `LLMEngine.add_request` (offline), or an `EngineClient` at
its door (`generate`), so a server refuses a request with a 400 before a stream starts. The engine process's
client holds a copy of the same limits, so served and offline requests meet the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.engine.engine_request import EngineRequest
from ember.engine.rejection import RequestRejected
from ember.engine.structured.backend_choice import choose_backend
from ember.engine.structured.errors import SchemaError
from ember.kv.cache_manager import blocks_needed

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass(frozen=True)
class RequestLimits:
    """The engine's capacity as a request sees it: vocabulary, context window, KV blocks, step budget, tokenizer."""

    vocab_size: int
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    group_windows: tuple[int | None, ...]
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    has_tokenizer: bool = True
    structured_outputs_backend: str = "auto"

    def check(self, request: EngineRequest) -> None:
        """Raise RequestRejected, naming the field and what to change, if `request` could never run here."""
        params = request.params
        self._check_prompt(request.prompt_token_ids)
        self._check_token_ids(params.logit_bias, "logit_bias")
        self._check_token_ids(params.allowed_token_ids or (), "allowed_token_ids")
        if not self.has_tokenizer:
            for name, value in (("bad_words", params.bad_words), ("structured_output", params.structured_output)):
                if value:
                    raise RequestRejected(f"{name} need the model's tokenizer, and this engine has none; give it one "
                                          f"(--tokenizer) or drop {name}", name)  # fmt: skip
        if params.structured_output is not None:
            try:
                choose_backend(params.structured_output, self.structured_outputs_backend)
            except SchemaError as error:
                raise RequestRejected(str(error), "grammar" if params.structured_output.grammar else "structured_output") from error
        if params.n > self.max_num_seqs:
            raise RequestRejected(f"n ({params.n}) exceeds max_num_seqs ({self.max_num_seqs}); lower n or raise --max-num-seqs", "n")
        self._check_fits(len(request.prompt_token_ids), params.max_tokens)

    def _check_prompt(self, prompt_token_ids: list[int]) -> None:
        num_prompt = len(prompt_token_ids)
        if max(prompt_token_ids) >= self.vocab_size:
            raise RequestRejected(f"prompt token ids must be from 0 to {self.vocab_size - 1}", "prompt")
        if num_prompt >= self.max_model_len:
            raise RequestRejected(
                f"the prompt has {num_prompt} tokens, but the context window is {self.max_model_len} and leaves no room "
                f"to generate; shorten the prompt to at most {self.max_model_len - 1} tokens",
                "prompt", CONTEXT_LENGTH_EXCEEDED,
            )

    def _check_token_ids(self, token_ids, name: str) -> None:
        if any(token_id >= self.vocab_size for token_id in token_ids):
            raise RequestRejected(f"{name} token ids must be from 0 to {self.vocab_size - 1}", name)

    def _check_fits(self, num_prompt: int, asked_max_tokens: int | None) -> None:
        """The prompt plus its output (max_tokens; None: up to the context window) fits the window, cache and steps."""
        max_tokens = asked_max_tokens or (self.max_model_len - num_prompt)
        if num_prompt + max_tokens > self.max_model_len:
            raise RequestRejected(
                f"max_tokens ({max_tokens}) does not fit: the prompt is {num_prompt} tokens and the context window is "
                f"{self.max_model_len}, so at most {self.max_model_len - num_prompt} can be generated; lower max_tokens "
                "or shorten the prompt",
                "max_tokens", CONTEXT_LENGTH_EXCEEDED,
            )
        needed = blocks_needed(num_prompt + max_tokens, self.block_size, self.group_windows, self.max_num_batched_tokens)
        if needed > self.num_kv_blocks:
            raise RequestRejected(
                f"this request needs {needed} KV blocks but the cache has {self.num_kv_blocks}; "
                "lower max_tokens or raise --kv-cache-memory / --num-kv-blocks",
                "max_tokens",
            )
        if not self.enable_chunked_prefill and num_prompt + max_tokens > self.max_num_batched_tokens:
            raise RequestRejected(
                f"with chunked prefill off, prompt + output ({num_prompt + max_tokens} tokens) must fit "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}); raise it or enable chunked prefill",
                "max_tokens",
            )
