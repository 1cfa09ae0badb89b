"""Renders chat messages to a prompt with a model's own Jinja chat template (as HF transformers does)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Variables the renderer sets itself: template kwargs may not replace them.
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"})


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
               tools: list[dict[str, Any]] | None = None, *, continue_final_message: bool = False,
               variables: Mapping[str, Any] | None = None) -> str:
        """The prompt text for `messages`, ending with the assistant header if asked; `tools` (function
        definitions, as Hugging Face templates take them) for templates that render tools.

        `continue_final_message`: the text stops right after the last message's content (an assistant
        turn the model goes on writing) instead of closing it. `variables`: more names for the template
        (such as Qwen3's `enable_thinking`); none may be one the renderer sets (RESERVED_VARIABLES).
        """
        check_rendering(messages[-1] if messages else None, add_generation_prompt, continue_final_message, variables)
        try:
            text = self._template.render(
                **dict(variables or {}),
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
        return _cut_after_final(text, messages[-1]["content"]) if continue_final_message else text


class RenderingError(ValueError):
    """Rendering arguments that contradict each other or the messages; `argument` names the one at fault
    ("variables" or "continue_final_message")."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def check_rendering(last: Mapping[str, Any] | None, add_generation_prompt: bool, continue_final_message: bool,
                    variables: Mapping[str, Any] | None) -> None:
    """Raise RenderingError unless a conversation whose last message is `last` can be rendered so: template variables
    that do not replace the renderer's own, and a continued last message that is an assistant turn with content and
    gets no generation prompt after it."""
    taken = sorted(RESERVED_VARIABLES & set(variables or ()))
    if taken:
        raise RenderingError("variables", f"template variables may not set {taken}: the renderer sets them from its own arguments")
    if not continue_final_message:
        return
    if add_generation_prompt:
        raise RenderingError("continue_final_message", "continue_final_message goes on writing the last message; it cannot "
                             "also add a generation prompt (set add_generation_prompt to false)")  # fmt: skip
    if last is None or last.get("role") != "assistant" or not last.get("content"):
        raise RenderingError("continue_final_message",
                             "continue_final_message needs the last message to be an assistant turn with content to continue")


def _cut_after_final(text: str, content: str) -> str:
    """`text` up to the end of the last place it writes `content` (or, for templates that trim it, its stripped form)."""
    for written in (content, content.strip()):
        end = text.rfind(written)
        if written and end >= 0:
            return text[: end + len(written)]
    raise ChatTemplateError("the model's chat template does not write the final message's content as given, "
                            "so it cannot be continued")  # fmt: skip


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
