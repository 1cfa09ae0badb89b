"""Chat templates: given a model's Jinja template and messages, the prompt is exactly the template's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.server.common.errors import ApiError
from ember.server.openai.chat_template import ChatTemplate, RenderRequest
from ember.server.openai.protocol import ChatMessage
from tests.shared_assets import shared_file

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def smollm2_template(shared_dir: Path) -> ChatTemplate:
    path = shared_file(shared_dir, "tokenizers/smollm2/chat_template.jinja")
    return ChatTemplate(path.read_text(encoding="utf-8"))


def messages(*pairs: tuple[str, str]) -> list[ChatMessage]:
    return [ChatMessage(role=role, content=content) for role, content in pairs]


def test_smollm2_adds_its_default_system_turn_and_the_assistant_header(smollm2_template: ChatTemplate) -> None:
    prompt = smollm2_template.render(messages(("user", "Hi")))
    assert prompt == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_developer_role_is_rendered_as_system(smollm2_template: ChatTemplate) -> None:
    prompt = smollm2_template.render(messages(("developer", "Be brief."), ("user", "Hi")), RenderRequest(add_generation_prompt=False))
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_text_parts_are_joined() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    message = ChatMessage.model_validate({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    assert template.render([message]) == "ab"


def test_an_earlier_replys_reasoning_reaches_the_template_under_qwen3s_name() -> None:
    template = ChatTemplate("{% for m in messages %}[{{ m.get('reasoning_content', '-') }}|{{ m['content'] }}]{% endfor %}")
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r1"},
             {"role": "assistant", "content": "b", "reasoning": "r2"}]
    assert template.render([ChatMessage.model_validate(turn) for turn in turns]) == "[-|q][r1|a][r2|b]"


def test_raise_exception_in_a_template_is_a_400_naming_messages() -> None:
    template = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}")
    with pytest.raises(ApiError) as raised:
        template.render(messages(("assistant", "x")))
    assert raised.value.status_code == 400 and raised.value.param == "messages"
    assert "first must be user" in raised.value.message


def test_a_template_that_does_not_compile_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_the_sandbox_blocks_attribute_escapes() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ApiError):
        template.render(messages(("user", "x")))


def test_tools_and_a_tool_call_turn_render_as_transformers_renders_them(shared_dir: Path) -> None:
    """Reference: transformers' apply_chat_template on Qwen2.5's template (tools in the system turn, calls and results)."""
    from transformers import AutoTokenizer

    folder = shared_file(shared_dir, "tokenizers/qwen2.5/tokenizer.json").parent
    tool = {"type": "function", "function": {"name": "lookup", "description": "Find a <word> & its 'meaning'",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}, "lang": {"enum": ["en", "fr"]}}, "required": ["word"]}}}  # fmt: skip
    history = [
        {"role": "user", "content": "What does 'ember' mean?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "ember", "lang": "en"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a glowing coal"},
    ]  # fmt: skip
    reference = AutoTokenizer.from_pretrained(folder)
    hf_history = [dict(m, tool_calls=[{"type": "function", "function": {"name": "lookup", "arguments": {"word": "ember", "lang": "en"}}}]) if m.get("tool_calls") else m
                  for m in history]  # fmt: skip
    expected = reference.apply_chat_template(hf_history, tools=[tool], add_generation_prompt=True, tokenize=False)
    ours = ChatTemplate(reference.chat_template).render([ChatMessage.model_validate(m) for m in history], RenderRequest(tools=[tool]))
    assert ours == expected
    assert "<word> & its 'meaning'" in ours


@pytest.mark.parametrize("name", ["qwen2.5", "smollm2"])
def test_continue_final_message_renders_as_transformers_renders_it(shared_dir: Path, name: str) -> None:
    """Reference: apply_chat_template(continue_final_message=True): the prompt stops right after the last turn's text."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(shared_file(shared_dir, f"tokenizers/{name}/tokenizer.json").parent)
    history = [{"role": "user", "content": "Name three colours."}, {"role": "assistant", "content": "Red, green and "}]
    expected = reference.apply_chat_template(history, continue_final_message=True, tokenize=False)
    ours = ChatTemplate(reference.chat_template).render([ChatMessage.model_validate(m) for m in history],
                                                        RenderRequest(add_generation_prompt=False, continue_final_message=True))  # fmt: skip
    assert ours == expected and ours.endswith("Red, green and ")


def test_template_variables_reach_the_template_as_transformers_passes_them(shared_dir: Path) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(shared_file(shared_dir, "tokenizers/smollm2/tokenizer.json").parent)
    source = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if enable_thinking %}<think>{% else %}<answer>{% endif %}"
    history = [{"role": "user", "content": "Hi"}]
    for variables in ({"enable_thinking": True}, {"enable_thinking": False}, {}):
        expected = reference.apply_chat_template(history, chat_template=source, tokenize=False, **variables)
        assert ChatTemplate(source).render(messages(("user", "Hi")), RenderRequest(variables=variables)) == expected


def test_a_continued_turn_the_template_rewrites_is_refused() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(ApiError, match="cannot be continued"):
        template.render(messages(("user", "a"), ("assistant", "b")), RenderRequest(add_generation_prompt=False, continue_final_message=True))
