"""Grammar-constrained replies through the real server and the official openai client: vLLM's `guided_grammar` and
`structured_outputs.grammar`, llama.cpp's `grammar` field, GBNF and Lark; a grammar that does not parse is a 400 with
an OpenAI error naming the field; a server started with `--structured-outputs-backend ember` refuses grammars by name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server.harness import (
    SERVED_MODEL,
    ServeProcess,
    assert_openai_error,
    tiny_server_process,
)

pytest.importorskip("llguidance")

YES_NO_GBNF = 'root ::= "Answer: " ("yes" | "no") "."'
LIST_LARK = 'start: "[" item ("," item)* "]"\nitem: /[0-9]/ | "ten"'
QUESTION = [{"role": "user", "content": "Is fire hot? Answer yes or no."}]


def _client(server: ServeProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)


def test_guided_grammar_holds_a_chat_reply_to_a_gbnf_grammar(smollm2_server: ServeProcess) -> None:
    reply = _client(smollm2_server).chat.completions.create(model=SERVED_MODEL, messages=QUESTION, max_tokens=12, temperature=0,
                                                            extra_body={"guided_grammar": YES_NO_GBNF}).choices[0]  # fmt: skip
    assert re.fullmatch(r"Answer: (yes|no)\.", reply.message.content), reply.message.content
    assert reply.finish_reason == "stop"


def test_structured_outputs_grammar_holds_a_sampled_reply_to_a_lark_grammar(smollm2_server: ServeProcess) -> None:
    client = _client(smollm2_server)
    for seed in range(3):
        reply = client.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user", "content": "Some numbers?"}],
                                               max_tokens=40, temperature=1.0, seed=seed,
                                               extra_body={"structured_outputs": {"grammar": LIST_LARK}}).choices[0]  # fmt: skip
        text = reply.message.content
        if reply.finish_reason == "stop":
            assert re.fullmatch(r"\[([0-9]|ten)(,([0-9]|ten))*\]", text), text
        else:  # ran out of tokens: a prefix of such a list
            assert reply.finish_reason == "length" and re.fullmatch(r"\[(([0-9]|ten),)*([0-9]|t|te|ten)?", text), text


def test_llama_cpp_grammar_field_holds_a_completion_and_its_stream(smollm2_server: ServeProcess) -> None:
    client = _client(smollm2_server)
    body = {"grammar": YES_NO_GBNF}
    whole = client.completions.create(model=SERVED_MODEL, prompt="Is ice cold?", max_tokens=12, temperature=0,
                                      extra_body=body).choices[0]  # fmt: skip
    assert re.fullmatch(r"Answer: (yes|no)\.", whole.text), whole.text
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=SERVED_MODEL, prompt="Is ice cold?", max_tokens=12, temperature=0, extra_body=body, stream=True) if chunk.choices)
    assert streamed == whole.text


def test_a_stop_string_inside_forced_text_ends_the_reply_there(smollm2_server: ServeProcess) -> None:
    """Forced tokens (jump-forward) go through the same stop checks as sampled ones."""
    reply = _client(smollm2_server).completions.create(model=SERVED_MODEL, prompt="Is ice cold?", max_tokens=12, temperature=0,
                                                       stop=["swer"], extra_body={"grammar": YES_NO_GBNF}).choices[0]  # fmt: skip
    assert reply.text == "An" and reply.finish_reason == "stop"


@pytest.mark.parametrize(("field", "value", "param"), [
    ("guided_grammar", 'root ::= "a', "guided_grammar"),
    ("structured_outputs", {"grammar": "start: undefined_rule"}, "structured_outputs"),
    ("grammar", "hello world", "grammar"),
])  # fmt: skip
def test_a_grammar_that_does_not_parse_is_a_400_naming_the_field(smollm2_server: ServeProcess, field, value, param) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        _client(smollm2_server).chat.completions.create(model=SERVED_MODEL, messages=QUESTION, max_tokens=4,
                                                        extra_body={field: value})  # fmt: skip
    assert raised.value.status_code == 400
    response = httpx.post(f"{smollm2_server.base_url}/v1/chat/completions",
                          json={"model": SERVED_MODEL, "messages": QUESTION, "max_tokens": 4, field: value})  # fmt: skip
    error = assert_openai_error(response, 400)
    assert error["param"] == param and "grammar does not parse" in error["message"], error


@pytest.fixture(scope="module")
def ember_backend_server(tiny_model_dir: Path, smollm2_tokenizer_dir: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:  # fmt: skip
    log_path = tmp_path_factory.mktemp("ember-backend") / "serve.log"
    with tiny_server_process(tiny_model_dir, smollm2_tokenizer_dir, log_path, "--served-model-name", "tiny",
                             "--structured-outputs-backend", "ember") as server:
        yield server


def test_a_server_on_embers_own_backend_refuses_a_grammar_by_name_and_serves_json(ember_backend_server: ServeProcess) -> None:
    client = _client(ember_backend_server)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="tiny", prompt="a", max_tokens=4,
                                  extra_body={"guided_grammar": YES_NO_GBNF})  # fmt: skip
    assert "does not read grammars" in str(raised.value) and "--structured-outputs-backend" in str(raised.value)
    reply = client.completions.create(model="tiny", prompt="a", max_tokens=8, temperature=0,
                                      extra_body={"guided_choice": ["left", "right"]}).choices[0]  # fmt: skip
    assert reply.text in ("left", "right")
