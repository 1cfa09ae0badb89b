"""Renders chat messages to a prompt with the model's own Jinja chat template."""

from __future__ import annotations

from collections.abc import Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ember.server.errors import ApiError
from ember.server.protocol import ChatMessage


class ChatTemplateError(Exception):
    """The template itself is broken or raised on purpose (e.g. unsupported role order)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to.

    Rendering runs in Jinja's immutable sandbox, as HF transformers does, since templates
    come from model files; `raise_exception(msg)` inside a template becomes a 400.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise_exception
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"the chat template does not compile: {error}") from error
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages`, ending with the assistant header if asked."""
        plain = [_as_template_message(message) for message in messages]
        try:
            return self._template.render(
                messages=plain,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except ChatTemplateError as error:
            raise ApiError(f"The model's chat template rejected these messages: {error}", param="messages") from error
        except jinja2.TemplateError as error:
            raise ApiError(
                f"The model's chat template could not render these messages: {error}", param="messages"
            ) from error


def _as_template_message(message: ChatMessage) -> dict[str, str]:
    role = "system" if message.role == "developer" else message.role
    plain = {"role": role, "content": message.text()}
    if message.name is not None:
        plain["name"] = message.name
    return plain


def load_chat_template(tokenizer, override: str | None = None) -> ChatTemplate | None:
    """The template to use: `override` (template text) if given, else the tokenizer's, else None."""
    source = override if override is not None else tokenizer.chat_template
    if not source:
        return None
    return ChatTemplate(source, _token_text(tokenizer, tokenizer.bos_id), _token_text(tokenizer, tokenizer.eos_id))


def _token_text(tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.id_to_piece(token_id)
