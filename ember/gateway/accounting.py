"""Token accounting: bounding a request's tokens before it runs, and metering what it used.

Budgets and rate limits hold exactly because the gateway reserves an upper bound of a request's
tokens (and their price) before sending it, then settles the reservation to the usage the
backend reported. A stream cut short is settled to what the client received.
"""

from __future__ import annotations

import dataclasses

from ember.gateway.config import AccountingConfig
from ember.gateway.responses import DELTA_EVENTS, RESPONSES_ENDPOINT, event_type, final_usage
from ember.gateway.store import MAX_RESERVATION


@dataclasses.dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @staticmethod
    def from_openai(usage: dict | None) -> TokenUsage | None:
        """The usage object of an OpenAI response or chunk, or None if it has none. Chat and
        completions name the counts prompt/completion tokens, the Responses API input/output tokens."""
        if not isinstance(usage, dict):
            return None
        prompt, completion, details = ("input_tokens", "output_tokens", "input_tokens_details") if "input_tokens" in usage else (
            "prompt_tokens", "completion_tokens", "prompt_tokens_details")  # fmt: skip
        details = usage.get(details)
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        return TokenUsage(_count(usage.get(prompt)), _count(usage.get(completion)), _count(cached))


def _count(value: object) -> int:
    """A token count a backend reported, as a non-negative int: a missing, negative or malformed
    count is 0, so no backend's answer can move a key's spend backwards or crash the settlement."""
    return value if type(value) is int and 0 <= value <= MAX_RESERVATION else 0


def prompt_text(endpoint: str, body: dict) -> str:
    """The prompt's text, for prefix routing, the cache and the token bound."""
    if endpoint == "/chat/completions":
        return "".join(f"{message.get('role', '')}\n{content_text(message.get('content'))}\n" for message in body.get("messages") or ())
    if endpoint == RESPONSES_ENDPOINT:
        return "".join(f"{role}\n{text}\n" for role, text in response_turns(body))
    prompt = body.get("input" if endpoint == "/embeddings" else "prompt", "")
    if isinstance(prompt, str):
        return prompt
    return "\n".join(item if isinstance(item, str) else " ".join(map(str, item)) if isinstance(item, list) else str(item) for item in prompt)


def response_turns(body: dict) -> list[tuple[str, str]]:
    """A Responses API request as the (role, text) turns of the conversation it amounts to, as
    ember's server renders it: `instructions` a system turn, a text `input` a user turn, input
    messages as they are, earlier function calls assistant turns (name and arguments), their
    outputs tool turns. A chat request with the same conversation has the same prompt text, so
    both route to the replica that holds its prefix."""
    instructions = body.get("instructions")
    turns = [("system", instructions)] if isinstance(instructions, str) and instructions else []
    items = body.get("input")
    if isinstance(items, str):
        return [*turns, ("user", items)]
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or "message"
        if kind == "function_call":
            turns.append(("assistant", f"{item.get('name', '')}({item.get('arguments', '')})"))
        elif kind == "function_call_output":
            turns.append(("tool", content_text(item.get("output"))))
        else:
            turns.append((str(item.get("role", "")), content_text(item.get("content"))))
    return turns


def content_text(content) -> str:
    """A message's text whether it is a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def prompt_token_bound(endpoint: str, body: dict, config: AccountingConfig) -> int:
    """An upper bound of the prompt's token count: one token per UTF-8 byte (byte-level
    tokenizers never do worse), plus the chat template's tokens per message."""
    if endpoint == "/chat/completions":
        messages = body.get("messages") or ()
        text_bytes = sum(len(content_text(message.get("content")).encode("utf-8")) for message in messages)
        return text_bytes + config.template_tokens_per_message * (len(messages) + 1)
    if endpoint == RESPONSES_ENDPOINT:
        turns = response_turns(body)
        text_bytes = sum(len(text.encode("utf-8")) for _, text in turns)
        return text_bytes + config.template_tokens_per_message * (len(turns) + 1)
    prompt = body.get("input" if endpoint == "/embeddings" else "prompt", "")
    prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
    bound = 0
    for item in prompts:
        bound += len(item.encode("utf-8")) if isinstance(item, str) else len(item)
        bound += config.template_tokens_per_message  # BOS and friends
    return bound


def completion_limit(endpoint: str, body: dict) -> int | None:
    """The cap on the completion the request names: max_output_tokens in the Responses API (whose
    servers refuse max_tokens), max_completion_tokens or max_tokens elsewhere."""
    names = ("max_output_tokens",) if endpoint == RESPONSES_ENDPOINT else ("max_completion_tokens", "max_tokens")
    return next((body[name] for name in names if body.get(name) is not None), None)


def with_completion_limit(endpoint: str, body: dict, config: AccountingConfig) -> dict:
    """The body, capped at `default_max_tokens` if it names no cap: the reservation needs a bound,
    and the backend must not generate past it."""
    if completion_limit(endpoint, body) is not None:  # 0 (completions with echo) is a cap too
        return body
    field = "max_output_tokens" if endpoint == RESPONSES_ENDPOINT else "max_tokens"
    return {**body, field: config.default_max_tokens}


def completion_token_bound(endpoint: str, body: dict, config: AccountingConfig) -> int:
    """The completion cap times the number of choices (best_of's, if more) and prompts."""
    limit = completion_limit(endpoint, body)
    max_tokens = config.default_max_tokens if limit is None else limit
    choices = max(body.get("n") or 1, body.get("best_of") or 1)
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return max_tokens * choices * prompts


class StreamMeter:
    """Watches the chunks a client actually received: usage, token chunks, and choice 0's text.

    When the backend reports usage on every chunk (ember's `continuous_usage_stats`) the meter
    knows the exact count at any cut; otherwise it counts one token per content chunk received
    and takes the prompt size from any usage the backend sent, else the prompt bound.
    """

    def __init__(self, prompt_bound: int) -> None:
        self._prompt_bound = prompt_bound
        self._upstream_prompt_tokens: int | None = None
        self._reported: TokenUsage | None = None
        self._token_chunks = 0
        self._text_parts: list[str] = []
        self.finished = False
        self.finish_reason: str | None = None  # choice 0's, as the backend sent it (a cached replay keeps `length`)

    def note_upstream(self, chunk: dict) -> None:
        """A chunk the backend sent, delivered or not: it may tell the real prompt size."""
        reported = TokenUsage.from_openai(chunk.get("usage"))
        if reported is not None:
            self._upstream_prompt_tokens = reported.prompt_tokens

    def observe(self, chunk: dict) -> None:
        """A chunk the client received."""
        reported = TokenUsage.from_openai(chunk.get("usage"))
        if reported is not None:
            self._reported = reported
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if choice.get("index", 0) == 0 and text:
                self._text_parts.append(text)
            if text or choice.get("finish_reason"):
                self._token_chunks += 1
            if choice.get("finish_reason") and choice.get("index", 0) == 0:
                self.finished = True
                self.finish_reason = choice["finish_reason"]

    def usage(self) -> TokenUsage:
        """The tokens received so far."""
        if self._reported is not None:
            return self._reported
        prompt_tokens = self._prompt_bound if self._upstream_prompt_tokens is None else self._upstream_prompt_tokens
        return TokenUsage(prompt_tokens, self._token_chunks)

    def text(self) -> str:
        return "".join(self._text_parts)


class ResponseStreamMeter(StreamMeter):
    """A StreamMeter for the Responses API's typed events. Usage comes only with the final event
    (inside its `response`), so a stream cut before it is counted one token per text or arguments
    delta the client received, with the prompt bound for the prompt. It keeps no text and never
    reads as `finished`: a streamed response is not stored in the cache (`serving.is_cacheable`)."""

    def note_upstream(self, chunk: dict) -> None:
        reported = TokenUsage.from_openai(final_usage(chunk))
        if reported is not None:
            self._upstream_prompt_tokens = reported.prompt_tokens

    def observe(self, chunk: dict) -> None:
        reported = TokenUsage.from_openai(final_usage(chunk))
        if reported is not None:
            self._reported = reported
        if event_type(chunk) in DELTA_EVENTS:
            self._token_chunks += 1


def stream_meter(endpoint: str, prompt_bound: int) -> StreamMeter:
    """The meter that reads this endpoint's stream chunks."""
    return ResponseStreamMeter(prompt_bound) if endpoint == RESPONSES_ENDPOINT else StreamMeter(prompt_bound)
