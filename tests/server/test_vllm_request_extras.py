"""vLLM's extra request fields over the real engine: ids, priority, truncation, token-id logprobs, echo, documents.

Clients written for vLLM send these beside OpenAI's fields; each either does what vLLM does with it or is
refused by name (a 400 naming the field), never ignored silently.
"""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from tests.server.harness import ThreadedServer, assert_openai_error, parse_sse
from tests.server.real_engine import GREEDY, MODEL, RecordingEngine, tiny_app

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def http(engine: RecordingEngine):
    with ThreadedServer(tiny_app(engine, trust_request_chat_template=True)) as running, \
            httpx.Client(base_url=running.base_url, timeout=30) as client:  # fmt: skip
        yield client


def _refused(response: httpx.Response) -> str | None:
    """The field a 400 names."""
    return assert_openai_error(response, 400)["param"]


def test_a_clients_request_id_names_the_response_and_the_engine_request(http: httpx.Client, engine: RecordingEngine) -> None:
    chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "request_id": "trace-7"}).json()
    assert chat["id"] == "chatcmpl-trace-7"
    again = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "request_id": "trace-7"})
    assert again.json()["id"] == "chatcmpl-trace-7"  # reused by the client: the engine still tells them apart
    assert len([i for i in engine.requests if i.startswith("chatcmpl-trace-7")]) == 2
    text = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "request_id": "trace-8"}).json()
    assert text["id"] == "cmpl-trace-8"
    assert engine.only("cmpl-trace-8-0")


def test_priority_reaches_the_engine(http: httpx.Client, engine: RecordingEngine) -> None:
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "request_id": "urgent", "priority": -5})
    http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "request_id": "later", "priority": 3})
    http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "request_id": "plain"})
    assert engine.only("chatcmpl-urgent").priority == -5
    assert engine.only("cmpl-later").priority == 3
    assert engine.only("cmpl-plain").priority == 0


def test_cache_salt_reaches_the_engine(http: httpx.Client, engine: RecordingEngine) -> None:
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "request_id": "salted", "cache_salt": "s3cret"})
    http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "request_id": "salted-text", "cache_salt": "pepper"})
    assert engine.only("chatcmpl-salted").cache_salt == "s3cret"
    assert engine.only("cmpl-salted-text").cache_salt == "pepper"
    assert _refused(http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "cache_salt": ""})) == "cache_salt"


def test_truncate_prompt_tokens_keeps_the_last_tokens_even_of_a_prompt_too_long_to_fit(http: httpx.Client, engine: RecordingEngine) -> None:
    prompt = " ".join(str(i) for i in range(300))  # over 256 tokens against a context window of 256
    assert _refused(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})) == "prompt"
    reply = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "truncate_prompt_tokens": 6,
                                               "request_id": "cut"}).json()  # fmt: skip
    assert reply["usage"]["prompt_tokens"] == 6
    assert engine.only("cmpl-cut").prompt_token_ids == engine.tokenizer.encode(prompt, add_special_tokens=True)[-6:]
    chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "truncate_prompt_tokens": 3,
                                                   "request_id": "cut-chat"}).json()  # fmt: skip
    assert engine.only("chatcmpl-cut-chat").prompt_token_ids == engine.tokenizer.encode("<|user|>Hi\n<|assistant|>")[-3:]
    assert chat["usage"]["prompt_tokens"] == 3
    whole = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(engine.tokenizer.encode("ab", add_special_tokens=True))  # kept whole


def test_return_tokens_as_token_ids_writes_logprob_tokens_as_ids(http: httpx.Client, engine: RecordingEngine) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True,
            "ignore_eos": True, **GREEDY}  # fmt: skip
    reply = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    ids = engine.tokenizer.encode(reply["message"]["content"])
    content = reply["logprobs"]["content"]
    assert [position["token"] for position in content] == [f"token_id:{i}" for i in ids]
    assert content[0]["bytes"] == list(f"token_id:{ids[0]}".encode())
    assert content[0]["top_logprobs"][0]["token"] == f"token_id:{ids[0]}" and len(content[0]["top_logprobs"]) == 2
    legacy = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "logprobs": 1, "return_tokens_as_token_ids": True,
                                                "ignore_eos": True, **GREEDY}).json()["choices"][0]  # fmt: skip
    assert legacy["logprobs"]["tokens"] == [f"token_id:{i}" for i in engine.tokenizer.encode(legacy["text"])]


def test_echo_writes_the_continued_assistant_message_before_the_reply(http: httpx.Client) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Sure: "}]
    body = {"messages": messages, "max_tokens": 5, "continue_final_message": True, "add_generation_prompt": False, **GREEDY}
    reply = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    whole = http.post("/v1/chat/completions", json={**body, "echo": True}).json()
    assert whole["choices"][0]["message"]["content"] == "Sure: " + reply
    *chunks, done = parse_sse(http.post("/v1/chat/completions", json={**body, "echo": True, "stream": True}).text)
    assert done == "[DONE]"
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks) == "Sure: " + reply
    user_last = {"messages": MESSAGES, "max_tokens": 5, **GREEDY}
    plain = http.post("/v1/chat/completions", json=user_last).json()["choices"][0]["message"]["content"]
    echoed = http.post("/v1/chat/completions", json={**user_last, "echo": True}).json()
    assert echoed["choices"][0]["message"]["content"] == plain  # only an assistant message is echoed


def test_documents_reach_the_chat_template_and_add_special_tokens_asks_the_tokenizers(http: httpx.Client,
                                                                                      engine: RecordingEngine) -> None:
    template = "{% for d in documents %}[{{ d.title }}]{% endfor %}{{ messages[-1].content }}"
    body = {"messages": MESSAGES, "max_tokens": 1, "chat_template": template, "documents": [{"title": "A"}, {"title": "B"}]}
    http.post("/v1/chat/completions", json={**body, "request_id": "docs"})
    assert engine.only("chatcmpl-docs").prompt_token_ids == engine.tokenizer.encode("[A][B]Hi")
    http.post("/v1/chat/completions", json={**body, "request_id": "bos", "add_special_tokens": True})
    assert engine.only("chatcmpl-bos").prompt_token_ids == engine.tokenizer.encode("[A][B]Hi", add_special_tokens=True)
    http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1, "request_id": "no-bos", "add_special_tokens": False})
    assert engine.only("cmpl-no-bos").prompt_token_ids == engine.tokenizer.encode("ab")


@pytest.mark.parametrize(("field", "value"), [
    ("use_beam_search", True), ("guided_whitespace_pattern", " "),
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


def test_openai_client_sends_them_as_extra_body(engine: RecordingEngine) -> None:
    """The way a vLLM user's code sends them: `extra_body` of the openai client."""
    with ThreadedServer(tiny_app(engine)) as running:
        client = OpenAI(base_url=f"{running.base_url}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, extra_body={
            "request_id": "sdk", "priority": 2, "truncate_prompt_tokens": 4, "ignore_eos": True})  # fmt: skip
    assert reply.id == "chatcmpl-sdk" and reply.usage.completion_tokens == 3
    sent = engine.only("chatcmpl-sdk")
    assert sent.priority == 2 and len(sent.prompt_token_ids) == 4
