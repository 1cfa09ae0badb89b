"""The model's chat template for HTTP requests: OpenAI messages in, prompt text out, refusals as 400s.

The rendering itself is ember.tokenizers.chat_template's (shared with `LLM.chat`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.server.common.errors import ApiError
from ember.server.openai.protocol import ChatMessage, ToolCall
from ember.tokenizers import chat_template as templates


@dataclass(frozen=True)
class RenderRequest:
    """What a request asks of the rendering beside its messages: the tools the reply may call, whether
    to end with the assistant header or go on writing the last (assistant) message, more template variables."""

    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    continue_final_message: bool = False
    variables: Mapping[str, Any] = field(default_factory=dict)


class ChatTemplate:
    """Renders request messages (`developer` read as `system`); a template refusal is a 400 on `messages`."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self._template = templates.ChatTemplate(source, bos_token, eos_token)

    def render(self, messages: Sequence[ChatMessage], how: RenderRequest = RenderRequest()) -> str:
        """The prompt text for `messages`, rendered as `how` asks."""
        try:
            return self._template.render([_as_template_message(m) for m in messages], how.add_generation_prompt, how.tools,
                                         continue_final_message=how.continue_final_message, variables=how.variables)  # fmt: skip
        except ValueError as error:  # the template refused, or the request's own checks missed a misuse
            text = str(error)
            raise ApiError(text[:1].upper() + text[1:], param="messages", code="chat_template_error") from error


class RequestTemplates:
    """Chat templates that requests bring (vLLM's `chat_template` field), compiled once each: the most
    recent `keep` are kept. Refused unless the operator trusts them (`--trust-request-chat-template`):
    a template is code the server runs, if sandboxed."""

    def __init__(self, trusted: bool, bos_token: str = "", eos_token: str = "", keep: int = 8) -> None:
        self._trusted = trusted
        self._special = (bos_token, eos_token)
        self._keep = keep
        self._compiled: OrderedDict[str, ChatTemplate] = OrderedDict()

    def get(self, source: str) -> ChatTemplate:
        """The compiled template of `source`; a 400 when not trusted or when it does not compile."""
        if not self._trusted:
            raise ApiError("This server does not take chat templates from requests; its operator can allow them "
                           "with --trust-request-chat-template.", param="chat_template", code="invalid_value")  # fmt: skip
        template = self._compiled.get(source)
        if template is None:
            try:
                template = ChatTemplate(source, *self._special)
            except ValueError as error:
                raise ApiError(f"Invalid chat_template: {error}.", param="chat_template", code="invalid_value") from error
            self._compiled[source] = template
            if len(self._compiled) > self._keep:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(source)
        return template


def _as_template_message(message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    plain: dict[str, Any] = {"role": role, "content": message.text()}
    if message.name is not None:
        plain["name"] = message.name
    if message.tool_calls:
        plain["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        plain["tool_call_id"] = message.tool_call_id
    reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
    if reasoning is not None:
        plain["reasoning_content"] = reasoning  # Qwen3's template reads this name
    return plain


def _template_tool_call(call: ToolCall) -> dict[str, Any]:
    """A past tool call as Hugging Face templates read it: arguments as an object where they parse as one."""
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = call.function.arguments
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


def load_chat_template(tokenizer, override: str | None = None) -> ChatTemplate | None:
    """The template to use: `override` (template text) if given, else the tokenizer's, else None."""
    source = override if override is not None else tokenizer.chat_template
    if not source:
        return None
    bos, eos = templates.special_token_texts(tokenizer)
    return ChatTemplate(source, bos, eos)


def request_templates(tokenizer, trusted: bool) -> RequestTemplates:
    """Where a server keeps the templates its requests bring, with the tokenizer's special token texts."""
    special = ("", "") if tokenizer is None else templates.special_token_texts(tokenizer)
    return RequestTemplates(trusted, *special)
