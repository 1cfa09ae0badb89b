"""RequestLimits: what a request may ask of one engine, checked in one place.

The engine checks every request it is given; a client in another process (the API process of
`ember serve`) holds a copy of the same limits, so it can refuse a request with a 400 before a
stream starts, without a round trip to the engine.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from ember.engine.sampling_params import SamplingParams
from ember.kv.cache_manager import blocks_needed


class RequestRejected(ValueError):
    """A request this engine can never run; `param` names the request field to change."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self):  # keep `param` when the rejection crosses a process boundary
        return (RequestRejected, (str(self), self.param))


@dataclass(frozen=True)
class RequestLimits:
    """The engine's capacity as a request sees it: vocabulary, context window, KV blocks, step budget."""

    vocab_size: int
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    group_windows: tuple[int | None, ...]
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise RequestRejected, saying what to change, if this request could never run here."""
        num_prompt = len(prompt_token_ids)
        self._check_prompt(prompt_token_ids)
        if any(token_id >= self.vocab_size for token_id in params.logit_bias):
            raise RequestRejected(f"logit_bias token ids must lie in [0, {self.vocab_size})", "logit_bias")
        if any(token_id >= self.vocab_size for token_id in params.allowed_token_ids or ()):
            raise RequestRejected(f"allowed_token_ids must lie in [0, {self.vocab_size})", "allowed_token_ids")
        max_tokens = params.max_tokens or (self.max_model_len - num_prompt)
        if num_prompt + max_tokens > self.max_model_len:
            raise RequestRejected(
                f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds the context window of "
                f"{self.max_model_len}; lower max_tokens to at most {self.max_model_len - num_prompt}",
                "max_tokens",
            )
        needed = blocks_needed(num_prompt + max_tokens, self.block_size, self.group_windows, self.max_num_batched_tokens)
        if needed > self.num_kv_blocks:
            raise RequestRejected(
                f"this request needs {needed} KV blocks but the cache has {self.num_kv_blocks}; "
                "lower max_tokens or raise --kv-cache-memory / --num-kv-blocks",
                "max_tokens",
            )
        if params.n > self.max_num_seqs:
            raise RequestRejected(f"n ({params.n}) exceeds max_num_seqs ({self.max_num_seqs}); lower n or raise --max-num-seqs", "n")
        if not self.enable_chunked_prefill and num_prompt + max_tokens > self.max_num_batched_tokens:
            raise RequestRejected(
                f"with chunked prefill off, prompt + output ({num_prompt + max_tokens} tokens) must fit "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}); raise it or enable chunked prefill",
                "max_tokens",
            )

    def _check_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise RequestRejected("the prompt is empty; give at least one token", "prompt")
        if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise RequestRejected(f"prompt token ids must be integers in [0, {self.vocab_size})", "prompt")
        if num_prompt >= self.max_model_len:
            raise RequestRejected(
                f"the prompt has {num_prompt} tokens; the context window is {self.max_model_len}, "
                f"so at most {self.max_model_len - 1} fit",
                "prompt",
            )
