"""vLLM's extra request fields over a fake engine: ids, priority, truncation, token-id logprobs, echo, documents.

Clients written for vLLM send these beside OpenAI's fields; each either does what vLLM does with it or is
refused by name (a 400 naming the field), never ignored silently.
"""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from ember.server import ServerConfig, build_app
from tests.server.fake_engine import FakeEngine
from tests.server.harness import ThreadedServer, assert_openai_error, parse_sse

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(step_s=0.001, max_model_len=128)


@pytest.fixture(scope="module")
def http(engine: FakeEngine):
    app = build_app(engine, ServerConfig(trust_request_chat_template=True))
    with ThreadedServer(app) as running, httpx.Client(base_url=running.base_url, timeout=30) as client:
        yield client


def _refused(response: httpx.Response) -> str | None:
    """The field a 400 names."""
    return assert_openai_error(response, 400)["param"]


def _only_request(engine: FakeEngine, prefix: str) -> str:
    (engine_id,) = [request_id for request_id in engine.prompts if request_id.startswith(prefix)]
    return engine_id


def test_a_clients_request_id_names_the_response_and_the_engine_request(http: httpx.Client, engine: FakeEngine) -> None:
    chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "request_id": "trace-7"}).json()
    assert chat["id"] == "chatcmpl-trace-7"
    again = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "request_id": "trace-7"})
    assert again.json()["id"] == "chatcmpl-trace-7"  # reused by the client: the engine still tells them apart
    assert len([i for i in engine.prompts if i.startswith("chatcmpl-trace-7")]) == 2
    text = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "request_id": "trace-8"}).json()
    assert text["id"] == "cmpl-trace-8"
    assert _only_request(engine, "cmpl-trace-8-0")


def test_priority_reaches_the_engine(http: httpx.Client, engine: FakeEngine) -> None:
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "request_id": "urgent", "priority": -5})
    http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "request_id": "later", "priority": 3})
    http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "request_id": "plain"})
    assert engine.priorities[_only_request(engine, "chatcmpl-urgent")] == -5
    assert engine.priorities[_only_request(engine, "cmpl-later")] == 3
    assert engine.priorities[_only_request(engine, "cmpl-plain")] == 0


def test_cache_salt_reaches_the_engine(http: httpx.Client, engine: FakeEngine) -> None:
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "request_id": "salted", "cache_salt": "s3cret"})
    http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "request_id": "salted-text", "cache_salt": "pepper"})
    assert engine.salts[_only_request(engine, "chatcmpl-salted")] == "s3cret"
    assert engine.salts[_only_request(engine, "cmpl-salted-text")] == "pepper"
    assert _refused(http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "cache_salt": ""})) == "cache_salt"


def test_truncate_prompt_tokens_keeps_the_last_tokens_even_of_a_prompt_too_long_to_fit(http: httpx.Client, engine: FakeEngine) -> None:
    prompt = "x" * 500 + "tail"  # 504 tokens against a context window of 128
    assert _refused(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})) == "prompt"
    reply = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "truncate_prompt_tokens": 6,
                                               "request_id": "cut"}).json()  # fmt: skip
    assert reply["usage"]["prompt_tokens"] == 6
    assert engine.prompts[_only_request(engine, "cmpl-cut")] == list(b"xxtail")
    chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "truncate_prompt_tokens": 3,
                                                   "request_id": "cut-chat"}).json()  # fmt: skip
    assert engine.prompts[_only_request(engine, "chatcmpl-cut-chat")] == list(b"t|>")  # "...<|assistant|>"
    assert chat["usage"]["prompt_tokens"] == 3
    whole = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == 3  # BOS + "ab": shorter than the window, kept whole


def test_return_tokens_as_token_ids_writes_logprob_tokens_as_ids(http: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True}
    content = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    assert [position["token"] for position in content] == ["token_id:104", "token_id:101"]  # "he"
    assert content[0]["bytes"] == list(b"token_id:104")
    assert [top["token"] for top in content[0]["top_logprobs"]] == ["token_id:104", "token_id:2"]
    legacy = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "logprobs": 1, "return_tokens_as_token_ids": True})
    assert legacy.json()["choices"][0]["logprobs"]["tokens"] == ["token_id:104", "token_id:101"]


def test_echo_writes_the_continued_assistant_message_before_the_reply(http: httpx.Client) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Sure: "}]
    body = {"messages": messages, "max_tokens": 5, "echo": True, "continue_final_message": True, "add_generation_prompt": False}
    whole = http.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["message"]["content"] == "Sure: hello"
    *chunks, done = parse_sse(http.post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert done == "[DONE]"
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks) == "Sure: hello"
    user_last = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 5, "echo": True}).json()
    assert user_last["choices"][0]["message"]["content"] == "hello"  # only an assistant message is echoed


def test_documents_reach_the_chat_template_and_add_special_tokens_adds_bos(http: httpx.Client, engine: FakeEngine) -> None:
    template = "{% for d in documents %}[{{ d.title }}]{% endfor %}{{ messages[-1].content }}"
    body = {"messages": MESSAGES, "max_tokens": 1, "chat_template": template, "documents": [{"title": "A"}, {"title": "B"}]}
    http.post("/v1/chat/completions", json={**body, "request_id": "docs"})
    assert engine.prompts[_only_request(engine, "chatcmpl-docs")] == list(b"[A][B]Hi")
    http.post("/v1/chat/completions", json={**body, "request_id": "bos", "add_special_tokens": True})
    assert engine.prompts[_only_request(engine, "chatcmpl-bos")] == [256, *b"[A][B]Hi"]
    http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1, "request_id": "no-bos", "add_special_tokens": False})
    assert engine.prompts[_only_request(engine, "cmpl-no-bos")] == list(b"ab")


@pytest.mark.parametrize(("field", "value"), [
    ("use_beam_search", True), ("guided_grammar", 'root ::= "a"'), ("guided_whitespace_pattern", " "),
    ("structural_tag", "{}"), ("logits_processors", ["x"]), ("vllm_xargs", {"a": 1}),
    ("kv_transfer_params", {"a": 1}), ("mm_processor_kwargs", {"a": 1}),
])  # fmt: skip
def test_vllm_fields_ember_does_not_implement_are_refused_by_name(http: httpx.Client, field: str, value: object) -> None:
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "a"})):
        response = http.post(path, json={**body, "max_tokens": 2, field: value})
        assert "does not support" in response.json()["error"]["message"]
        assert _refused(response) == field


def test_no_op_values_of_vllm_fields_are_accepted(http: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "use_beam_search": False, "length_penalty": 1.0, "vllm_xargs": {},
            "spaces_between_special_tokens": False, "guided_decoding_backend": "xgrammar", "kv_transfer_params": None,
            "mm_processor_kwargs": {}, "logits_processors": []}  # fmt: skip
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_bad_values_of_vllm_fields_are_400s_naming_them(http: httpx.Client) -> None:
    cases = [
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"bad_words": ["  "]}, "bad_words"),
        ({"request_id": ""}, "request_id"),
    ]
    for fields, param in cases:
        assert _refused(http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, **fields})) == param


def test_openai_client_sends_them_as_extra_body() -> None:
    """The way a vLLM user's code sends them: `extra_body` of the openai client."""
    engine = FakeEngine(step_s=0.001, max_model_len=128)
    with ThreadedServer(build_app(engine, ServerConfig())) as running:
        client = OpenAI(base_url=f"{running.base_url}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=3,
                                               extra_body={"request_id": "sdk", "priority": 2, "truncate_prompt_tokens": 4})  # fmt: skip
    assert reply.id == "chatcmpl-sdk" and reply.choices[0].message.content == "hel"
    (engine_id,) = engine.prompts
    assert engine.priorities[engine_id] == 2 and len(engine.prompts[engine_id]) == 4
