"""Renders chat messages to a prompt with a model's own Jinja chat template (as HF transformers does)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused these messages (its `raise_exception`) or could not render them."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to.

    Rendering runs in Jinja's immutable sandbox, since templates come from model files.
    Messages are plain mappings with "role" and "content" (and optionally "name").
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise_exception
        # As Hugging Face renders templates: tojson keeps key order and does not HTML-escape (tool schemas).
        environment.filters["tojson"] = _to_json
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"the chat template does not compile: {error}") from error
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for `messages`, ending with the assistant header if asked; `tools` (function
        definitions, as Hugging Face templates take them) for templates that render tools."""
        try:
            return self._template.render(
                messages=[dict(message) for message in messages],
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except ChatTemplateError as error:
            raise ChatTemplateError(f"the model's chat template rejected these messages: {error}") from error
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"the model's chat template could not render these messages: {error}") from error


def load_chat_template(tokenizer, override: str | None = None) -> ChatTemplate | None:
    """The template to use: `override` (template text) if given, else the tokenizer's, else None."""
    source = override if override is not None else tokenizer.chat_template
    if not source:
        return None
    return ChatTemplate(source, *special_token_texts(tokenizer))


def _to_json(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: tuple[str, str] | None = None,
             sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def special_token_texts(tokenizer) -> tuple[str, str]:
    """The BOS and EOS token texts a template may print ("" for a token the tokenizer lacks)."""
    return _token_text(tokenizer, tokenizer.bos_id), _token_text(tokenizer, tokenizer.eos_id)


def _token_text(tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.id_to_piece(token_id)
