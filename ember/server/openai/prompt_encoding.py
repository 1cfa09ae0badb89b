"""Prompt text -> token ids off the event loop, refusing prompts that cannot fit before paying for them.

Tokenizing a multi-megabyte prompt takes seconds; on the event loop it would stall every other
request, `/health` included. So chat templates are rendered and text is encoded in one worker
thread owned by the app (one, so a flood of huge prompts queues instead of multiplying memory),
and a prompt whose length alone proves it cannot fit the context window
(`Tokenizer.min_token_count`) is refused before any tokenizing.

A request whose text totals at most `INLINE_MAX_CHARS` characters is encoded on the loop itself:
that takes well under a millisecond, less than the hop to a thread. Beyond it the whole request
goes to the worker, a batch's prompts as one job (`encode_batch`): 256 short prompts encoded one by
one on the loop held `/health` for 1.5 s, each under the threshold.

Whatever the tokenizer or template raises for a prompt, the client gets a 4xx naming the prompt
and the failure is logged: a tokenizer bug must not turn a valid request into a 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ember.server.common.errors import ApiError
from ember.server.openai.chat_template import ChatTemplate, RenderRequest
from ember.server.openai.protocol import ChatMessage

logger = logging.getLogger("ember.server")

T = TypeVar("T")

INLINE_MAX_CHARS = 4096


class PromptEncoder:
    """Encodes prompts for one app's engine in a worker thread; `close()` stops the thread."""

    def __init__(self, tokenizer, max_model_len: int) -> None:
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-tokenize")

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def encode(self, text: str, *, add_special_tokens: bool, param: str, truncates: bool = False) -> list[int]:
        """Token ids of `text`, or a 400 if it cannot fit (unless the caller `truncates` it) or the tokenizer fails on it."""
        [ids] = await self.encode_batch([text], add_special_tokens=add_special_tokens, param=param, truncates=truncates)
        return ids

    async def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool, param: str,
                           truncates: bool = False) -> list[list[int]]:
        """Token ids of each text, as `encode` gives them; all of them in one worker job once their total size passes
        `INLINE_MAX_CHARS`, so a batch costs the loop one hop however its size is spread over its prompts."""
        is_short = sum(len(text) for text in texts) <= INLINE_MAX_CHARS
        return await self._run(self._encode_all_checked, texts, add_special_tokens, param, truncates,
                               param=param, inline=is_short)

    async def render(self, template: ChatTemplate, messages: Sequence[ChatMessage], how: RenderRequest) -> str:
        """The chat template rendered for `messages` as `how` asks (template errors are 400s)."""
        is_short = sum(len(message.text()) for message in messages) <= INLINE_MAX_CHARS
        return await self._run(template.render, messages, how, param="messages", inline=is_short)

    def refuse_if_too_long(self, text: str, param: str, truncates: bool = False) -> None:
        """A 400 when `text` alone provably takes the whole context window (no tokenizing needed; not checked when
        the caller `truncates` the ids), or when there is no tokenizer to encode it with."""
        if self._tokenizer is None:
            raise ApiError(
                "This model has no tokenizer, so text cannot be encoded; send token ids as 'prompt'.",
                param=param,
                code="no_tokenizer",
            )
        if truncates:
            return
        at_least = self._tokenizer.min_token_count(text)
        if at_least >= self._max_model_len:
            raise ApiError(
                f"The prompt is at least {at_least} tokens ({len(text)} characters), but this model's "
                f"context window is {self._max_model_len} tokens. Shorten the prompt.",
                param=param,
                code="context_length_exceeded",
            )

    def _encode_all_checked(self, texts: Sequence[str], add_special_tokens: bool, param: str,
                            truncates: bool) -> list[list[int]]:
        """Every text's bound checked before any is encoded (a batch with one hopeless prompt costs no encoding), then
        each encoded and its ids checked, in one job: the bound and the check read every character and id, which for
        a large batch is as much loop time as the encoding."""
        for text in texts:
            self.refuse_if_too_long(text, param, truncates)
        return [self._checked(self._tokenizer.encode(text, add_special_tokens), param) for text in texts]

    def close(self) -> None:
        """Stop the worker thread once queued work is done."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, function: Callable[..., T], *args: object, param: str, inline: bool) -> T:
        """`function(*args)` on the loop when `inline`, else in the worker; its failures are 400s."""
        try:
            if inline:
                return function(*args)
            return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        except ApiError:
            raise
        except Exception as error:
            logger.exception("the tokenizer failed on a prompt (%s)", param)
            raise ApiError(
                f"This model's tokenizer could not process the prompt ({type(error).__name__}: {error}).",
                param=param,
                code="unprocessable_prompt",
            ) from error

    def _checked(self, ids: list[int], param: str) -> list[int]:
        """`ids` if every one is an int in the vocabulary; else the tokenizer misbehaved on this input."""
        vocab_size = self._tokenizer.vocab_size
        if all(type(token) is int for token in ids) and (not ids or (min(ids) >= 0 and max(ids) < vocab_size)):
            return ids
        bad = [token for token in ids if type(token) is not int or not 0 <= token < vocab_size]
        logger.error("the tokenizer gave ids outside its vocabulary for a prompt (%s): %s", param, bad[:5])
        raise ApiError(
            f"This model's tokenizer cannot encode part of the prompt (it gave {bad[:5]}). "
            "Remove or replace the unusual characters.",
            param=param,
            code="unprocessable_prompt",
        )
