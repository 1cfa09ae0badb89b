"""Engine outputs -> OpenAI response objects: choices, logprobs in both formats, usage."""

from __future__ import annotations

from ember.engine.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from ember.server.openai.protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)


def usage_of(outputs: list[RequestOutput], completion_tokens: int) -> Usage:
    """Usage of a request made of these engine requests (one per prompt)."""
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    cached_tokens = sum(output.num_cached_tokens for output in outputs)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def openai_finish_reason(reason: str | None) -> str | None:
    """OpenAI knows `stop` and `length`; an aborted completion reports `stop` (it ended early)."""
    if reason is None or reason == "length":
        return reason
    return "stop"


class LogprobFormatter:
    """Turns the engine's per-position logprob dicts into OpenAI's two logprob formats and vLLM's prompt logprobs.

    With `tokens_as_ids` (vLLM's return_tokens_as_token_ids) every logprob token is written "token_id:<id>" (and its
    bytes are that text's), so a client can read ids back where a token's text is ambiguous or not valid UTF-8.
    """

    def __init__(self, tokenizer, tokens_as_ids: bool = False) -> None:
        self._tokenizer = tokenizer
        self._tokens_as_ids = tokens_as_ids

    def _text(self, token_id: int, decoded: str | None) -> str:
        if self._tokens_as_ids:
            return f"token_id:{token_id}"
        if decoded is not None:
            return decoded
        # an id past the tokenizer (a model's wider logits) or a gap in its vocabulary reads as nothing
        return self._tokenizer.id_to_piece(token_id) if self._tokenizer.has_token(token_id) else ""

    def _bytes(self, token_id: int) -> list[int]:
        if self._tokens_as_ids:
            return list(f"token_id:{token_id}".encode())
        return list(self._tokenizer.token_bytes(token_id)) if self._tokenizer.has_token(token_id) else []

    def vllm_prompt(self, positions: list[PositionLogprobs | None] | None, num_top: int | None) -> PromptLogprobs | None:
        """vLLM's `prompt_logprobs`: per prompt token, None for the first, else the token's own logprob, rank and text
        and those of the `num_top` likeliest ids; None when they were not asked for (`num_top` None)."""
        if positions is None or num_top is None:
            return None
        return [None if position is None else self._scored_ids(position, num_top) for position in positions]

    def _scored_ids(self, position: PositionLogprobs, num_top: int) -> dict[str, PromptLogprob]:
        (chosen_id, chosen), *others = position.items()  # the engine puts the position's own token first
        kept = [(chosen_id, chosen), *((token_id, lp) for token_id, lp in others if lp.rank <= num_top)]
        return {
            str(token_id): PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=self._text(token_id, lp.decoded_token))
            for token_id, lp in kept
        }

    def _top(self, position: PositionLogprobs, num_top: int) -> list[tuple[int, float, str]]:
        ranked = sorted(position.items(), key=lambda item: item[1].rank)[:num_top]
        return [(token_id, lp.logprob, self._text(token_id, lp.decoded_token)) for token_id, lp in ranked]

    def _legacy_top(self, position: PositionLogprobs, num_top: int, chosen_text: str, chosen_logprob: float) -> dict[str, float]:
        """A position's `num_top` likeliest tokens and, as OpenAI's legacy format always has it, the chosen
        token: up to `num_top` + 1 entries, so `top_logprobs[i][tokens[i]]` holds."""
        top = {text: logprob for _, logprob, text in self._top(position, num_top)}
        top.setdefault(chosen_text, chosen_logprob)
        return top

    def chat(self, part: CompletionOutput, num_top: int) -> ChatLogprobs | None:
        """`{"content": [{token, logprob, bytes, top_logprobs}]}` for the new tokens of `part`."""
        if part.logprobs is None:
            return None
        content = []
        for token_id, position in zip(part.token_ids, part.logprobs, strict=False):
            chosen = position.get(token_id) or next(iter(position.values()))
            content.append(
                TokenLogprob(
                    token=self._text(token_id, chosen.decoded_token),
                    logprob=chosen.logprob,
                    bytes=self._bytes(token_id),
                    top_logprobs=[
                        TopLogprob(token=text, logprob=logprob, bytes=self._bytes(top_id))
                        for top_id, logprob, text in self._top(position, num_top)
                    ],
                )
            )
        return ChatLogprobs(content=content)

    def prompt(self, token_ids: list[int], positions: list[PositionLogprobs | None], num_top: int) -> CompletionLogprobs:
        """The legacy format for the prompt's tokens (an echo): the first has no logprob, nothing came before it."""
        result = CompletionLogprobs()
        offset = 0
        for token_id, position in zip(token_ids, positions, strict=False):
            chosen = None if position is None else position.get(token_id)
            text = self._text(token_id, None if chosen is None else chosen.decoded_token)
            result.tokens.append(text)
            result.token_logprobs.append(None if chosen is None else chosen.logprob)
            result.top_logprobs.append(None if chosen is None else self._legacy_top(position, num_top, text, chosen.logprob))
            result.text_offset.append(offset)
            offset += len(text)
        return result

    def completion(self, part: CompletionOutput, num_top: int, text_offset: int) -> CompletionLogprobs | None:
        """The legacy `{tokens, token_logprobs, top_logprobs, text_offset}` for the new tokens."""
        if part.logprobs is None:
            return None
        result = CompletionLogprobs()
        offset = text_offset
        for token_id, position in zip(part.token_ids, part.logprobs, strict=False):
            chosen = position.get(token_id) or next(iter(position.values()))
            text = self._text(token_id, chosen.decoded_token)
            result.tokens.append(text)
            result.token_logprobs.append(chosen.logprob)
            result.top_logprobs.append(self._legacy_top(position, num_top, text, chosen.logprob))
            result.text_offset.append(offset)
            offset += len(text)
        return result
