"""The model's chat template for HTTP requests: OpenAI messages in, prompt text out, refusals as 400s.

The rendering itself is ember.tokenizers.chat_template's (shared with `LLM.chat`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ember.server.errors import ApiError
from ember.server.protocol import ChatMessage, ToolCall
from ember.tokenizers import chat_template as templates


class ChatTemplate:
    """Renders request messages (`developer` read as `system`); a template refusal is a 400 on `messages`."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self._template = templates.ChatTemplate(source, bos_token, eos_token)

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for `messages` (and the tools the reply may call), ending with the assistant header if asked."""
        try:
            return self._template.render([_as_template_message(m) for m in messages], add_generation_prompt, tools)
        except templates.ChatTemplateError as error:
            text = str(error)
            raise ApiError(text[:1].upper() + text[1:], param="messages", code="chat_template_error") from error


def _as_template_message(message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    plain: dict[str, Any] = {"role": role, "content": message.text()}
    if message.name is not None:
        plain["name"] = message.name
    if message.tool_calls:
        plain["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        plain["tool_call_id"] = message.tool_call_id
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
