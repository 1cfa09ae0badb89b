"""A tiny in-process stand-in for AsyncEngine, following its contract, for fast server tests.

Its tokenizer maps each UTF-8 byte to one token id (256 = BOS, 257 = EOS). Every completion
generates the text `FAKE_REPLY` over and over, one token per step; `hold()` makes new requests
wait (counted as waiting in `stats()`, as the engine's queue is) before their first token, so
tests can fill the waiting room.
"""

from __future__ import annotations

import asyncio
import time

from ember.engine.limits import RequestRejected
from ember.engine.llm_engine import EngineStats
from ember.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.tokenizers.base import Tokenizer

FAKE_REPLY = "hello world. "
CHATML = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte, plus BOS and EOS."""

    @property
    def vocab_size(self) -> int:
        return 258

    @property
    def bos_id(self) -> int:
        return 256

    @property
    def eos_id(self) -> int:
        return 257

    @property
    def add_bos(self) -> bool:
        return True

    @property
    def chat_template(self) -> str:
        return CHATML

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_special_tokens else ids

    def token_bytes(self, token_id: int) -> bytes:
        if token_id == self.bos_id:
            return b"<s>"
        if token_id == self.eos_id:
            return b"</s>"
        return bytes([token_id])

    def is_special(self, token_id: int) -> bool:
        return token_id >= 256


class FakeEngine:
    """Generates FAKE_REPLY deterministically, one token every `step_s` seconds."""

    def __init__(self, step_s: float = 0.01, max_model_len: int = 128, tokenizer: Tokenizer | None = None,
                 reply: str = FAKE_REPLY, max_num_seqs: int = 16) -> None:
        self.model_name = "fake-model"
        self.max_num_seqs = max_num_seqs  # seats of a step: a held engine has none free
        self.reply = reply  # the text generated, one byte a token, over and over
        self.tokenizer = tokenizer or ByteTokenizer()
        self.max_model_len = max_model_len
        self.step_s = step_s
        self.running: set[str] = set()
        self.waiting: set[str] = set()  # held before their first step, as in the engine's queue
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.prompt_tokens_total = 0
        self.priorities: dict[str, int] = {}  # request id -> the priority it was queued with
        self.prompts: dict[str, list[int]] = {}  # request id -> its prompt token ids
        self.salts: dict[str, str | None] = {}  # request id -> its cache salt
        self.generation_tokens_total = 0
        # A plain flag polled by the generator, so a test thread may flip it safely.
        self.is_held = False
        # When set, the engine reads as stopped (EngineClient.dead_reason).
        self.dead_reason: str | None = None
        # When set, every request's validation raises it (a ValueError: the engine's own refusal).
        self.rejection: Exception | None = None

    def hold(self) -> None:
        """Make requests wait before their first token until `release()`."""
        self.is_held = True

    def release(self) -> None:
        """Let held requests run."""
        self.is_held = False

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The real engine's up-front refusal: a set reason, an empty prompt, no room to generate, a biased id
        outside the vocabulary."""
        if self.rejection is not None:
            raise self.rejection
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if any(token_id >= self.tokenizer.vocab_size for token_id in params.logit_bias):
            raise RequestRejected(f"logit_bias token ids must lie in [0, {self.tokenizer.vocab_size})", "logit_bias")
        budget = self.max_model_len - len(prompt_token_ids)
        if params.max_tokens is not None and params.max_tokens > budget:
            raise ValueError(f"prompt plus max_tokens exceeds {self.max_model_len}")

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, prompt=None, priority=0,
                       cache_salt=None):
        """Deltas of the reply repeated, honouring n, max_tokens, stop and logprobs (prompt, `priority` and `cache_salt` recorded)."""
        self.validate_request(prompt_token_ids, params)
        self.priorities[request_id] = priority
        self.salts[request_id] = cache_salt
        self.prompts[request_id] = list(prompt_token_ids)
        budget = self.max_model_len - len(prompt_token_ids)
        max_tokens = budget if params.max_tokens is None else params.max_tokens
        metrics = RequestMetrics(arrival_time=time.monotonic())
        self.waiting.add(request_id)
        is_finished = False
        try:
            while self.is_held:
                await asyncio.sleep(0.005)
            self.waiting.discard(request_id)
            self.running.add(request_id)
            self.prompt_tokens_total += len(prompt_token_ids)
            texts = [""] * params.n
            for step in range(max_tokens):
                await asyncio.sleep(self.step_s)
                token_id = self.reply.encode()[step % len(self.reply)]
                piece = chr(token_id)
                is_last = step == max_tokens - 1
                stop_hit = next((s for s in params.stop if (texts[0] + piece).endswith(s)), None)
                parts = []
                for index in range(params.n):
                    texts[index] += piece
                    # Single-character stops only: the stop text itself is withheld.
                    text = "" if stop_hit is not None else piece
                    logprobs = None
                    if params.logprobs is not None:
                        position = {token_id: Logprob(-0.5, 1, piece)}
                        for rank in range(2, params.logprobs + 1):
                            position[rank] = Logprob(-1.0 * rank, rank, chr(rank + 64))
                        logprobs = [position]
                    reason = "stop" if stop_hit is not None else ("length" if is_last else None)
                    parts.append(
                        CompletionOutput(
                            index=index, text=text, token_ids=[token_id], logprobs=logprobs, finish_reason=reason
                        )
                    )
                self.generation_tokens_total += params.n
                is_finished = stop_hit is not None or is_last
                yield RequestOutput(
                    request_id=request_id,
                    prompt_token_ids=list(prompt_token_ids),
                    outputs=parts,
                    finished=is_finished,
                    prompt=prompt,
                    num_cached_tokens=0,
                    metrics=metrics,
                )
                if is_finished:
                    self.finished.append(request_id)
                    return
        finally:
            self.waiting.discard(request_id)
            self.running.discard(request_id)
            if not is_finished:
                self.aborted.append(request_id)

    def abort(self, request_id: str) -> None:
        """Record an abort (the generator's own cleanup already stopped it)."""
        self.running.discard(request_id)

    def stats(self) -> EngineStats:
        """The engine's own stats type, with the fake's counters."""
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=0.0,
            num_free_blocks=100,
            num_total_blocks=100,
            block_size=16,
            kv_cache_bytes=1 << 20,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=0,
            num_steps=0,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            computed_tokens_total=self.prompt_tokens_total + self.generation_tokens_total,
            num_free_seats=0 if self.is_held else max(0, self.max_num_seqs - len(self.running)),
        )

    def step_records(self) -> list:
        """No step records in the fake."""
        return []

    def shutdown(self) -> None:
        """Nothing to stop."""
