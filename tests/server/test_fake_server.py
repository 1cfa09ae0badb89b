"""The server's HTTP behaviour over a fake engine (fast): formats, errors, overload, limits, metrics.

Given an app built by `build_app` around `FakeEngine` and served by uvicorn in a thread, when a
client sends requests, then responses follow the OpenAI format exactly and nothing leaks.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from openai import OpenAI

from ember.server import ServerConfig, build_app
from tests.server.bad_inputs import BadRequest, bad_requests
from tests.server.fake_engine import FAKE_REPLY, FakeEngine
from tests.server.harness import ThreadedServer, assert_openai_error, parse_sse

MODEL = "fake-model"
MAX_WAITING = 4
MAX_BODY_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(step_s=0.005, max_model_len=128)


@pytest.fixture(scope="module")
def server(engine: FakeEngine):
    config = ServerConfig(max_waiting=MAX_WAITING, max_body_bytes=MAX_BODY_BYTES, retry_after_s=2)
    with ThreadedServer(build_app(engine, config)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: ThreadedServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def client(server: ThreadedServer) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def expected_text(num_tokens: int) -> str:
    return (FAKE_REPLY * (num_tokens // len(FAKE_REPLY) + 1))[:num_tokens]


def test_models_lists_the_engine_model(client: OpenAI) -> None:
    models = client.models.list().data
    assert [model.id for model in models] == [MODEL]


def test_chat_answers_with_usage_counted_by_the_tokenizer(client: OpenAI, engine: FakeEngine) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=7, temperature=0
    )
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected_text(7)
    assert response.choices[0].finish_reason == "length"
    prompt = "<|user|>Hi\n<|assistant|>"
    assert response.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    assert response.usage.completion_tokens == 7
    assert response.usage.total_tokens == response.usage.prompt_tokens + 7
    assert response.usage.prompt_tokens_details.cached_tokens == 0


def test_streamed_chat_reassembles_to_the_whole_answer(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == expected_text(9)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9


def test_explicit_nulls_mean_defaults(http: httpx.Client) -> None:
    nulls = dict.fromkeys(
        ["n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
         "min_tokens", "ignore_eos", "stream", "stream_options", "user", "logit_bias", "logprobs", "top_logprobs",
         "max_completion_tokens", "tools", "tool_choice", "response_format", "add_generation_prompt"]
    )  # fmt: skip
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **nulls}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == expected_text(2)


def test_stream_ends_with_done(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    assert "".join(event["choices"][0]["text"] for event in events[:-1]) == expected_text(3)


def test_completions_with_two_prompts_and_n_two_index_choices_by_prompt(client: OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt=["a", "b"], n=2, max_tokens=4)
    assert sorted(choice.index for choice in response.choices) == [0, 1, 2, 3]
    assert all(choice.text == expected_text(4) for choice in response.choices)
    assert response.usage.completion_tokens == 16
    assert response.usage.prompt_tokens == 4  # BOS + one byte, twice


def test_streamed_completions_of_two_prompts_interleave_and_count_usage(client: OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt=["a", "b"], n=2, max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    texts: dict[int, str] = {}
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {index: expected_text(3) for index in range(4)}
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == 4


def test_completions_accept_token_ids(client: OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=2)
    assert response.choices[0].text == expected_text(2)
    assert response.usage.prompt_tokens == 2


def test_echo_puts_each_prompt_before_every_choice_of_it_streamed_or_not(client: OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt=["ab", "cd"], n=2, max_tokens=3, echo=True)
    texts = {choice.index: choice.text for choice in response.choices}
    assert texts == {0: "ab" + expected_text(3), 1: "ab" + expected_text(3), 2: "cd" + expected_text(3), 3: "cd" + expected_text(3)}
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model=MODEL, prompt=["ab", "cd"], n=2, max_tokens=3, echo=True, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == texts
    by_ids = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=2, echo=True)
    assert by_ids.choices[0].text == "hi" + expected_text(2)  # token ids echo as their decoded text


def test_stop_string_ends_with_finish_reason_stop(client: OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt="x", max_tokens=20, stop=["."])
    assert response.choices[0].text == "hello world"
    assert response.choices[0].finish_reason == "stop"


def test_chat_logprobs_carry_top_alternatives(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, logprobs=True, top_logprobs=3
    )
    content = response.choices[0].logprobs.content
    assert [entry.token for entry in content] == list(expected_text(3))
    assert all(entry.logprob == -0.5 and len(entry.top_logprobs) == 3 for entry in content)
    assert content[0].bytes == list(b"h")


def test_completion_logprobs_use_the_legacy_format(client: OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt="x", max_tokens=3, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert logprobs.tokens == list(expected_text(3))
    assert logprobs.token_logprobs == [-0.5] * 3
    assert logprobs.text_offset == [0, 1, 2]
    assert all(len(top) == 2 for top in logprobs.top_logprobs)


def test_tokenize_and_detokenize_round_trip(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"prompt": "hé"}).json()
    assert tokens["tokens"] == [256, 104, 195, 169] and tokens["count"] == 4
    text = http.post("/detokenize", json={"tokens": [104, 195, 169]}).json()
    assert text == {"prompt": "hé"}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] == len("<|user|>Hi\n<|assistant|>")


def rendered(http: httpx.Client, **body) -> str:
    """The prompt /tokenize renders for a chat body (the fake tokenizer's ids are the text's bytes)."""
    answer = http.post("/tokenize", json=body)
    assert answer.status_code == 200, answer.text
    return bytes(answer.json()["tokens"]).decode()


def test_vllm_rendering_fields_continue_the_last_turn_and_reach_the_template(http: httpx.Client) -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    assert rendered(http, messages=history, continue_final_message=True) == "<|user|>Hi\n<|assistant|>Hel"
    assert rendered(http, messages=history) == "<|user|>Hi\n<|assistant|>Hel\n<|assistant|>"
    assert rendered(http, messages=history, add_generation_prompt=False) == "<|user|>Hi\n<|assistant|>Hel\n"
    reply = http.post("/v1/chat/completions", json={"messages": history, "max_tokens": 3, "continue_final_message": True})
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == len("<|user|>Hi\n<|assistant|>Hel")


def test_a_trusted_server_renders_with_the_template_a_request_brings(engine: FakeEngine) -> None:
    source = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if shout %}!{% endif %}"
    app = build_app(engine, ServerConfig(trust_request_chat_template=True))
    with ThreadedServer(app) as trusted, httpx.Client(base_url=trusted.base_url, timeout=30) as http:
        hello = [{"role": "user", "content": "Hi"}]
        assert rendered(http, messages=hello, chat_template=source) == "[Hi]"
        assert rendered(http, messages=hello, chat_template=source, chat_template_kwargs={"shout": True}) == "[Hi]!"
        assert rendered(http, messages=hello) == "<|user|>Hi\n<|assistant|>"  # the server's own otherwise
        broken = http.post("/v1/chat/completions", json={"messages": hello, "chat_template": "{% for %}"})
        assert assert_openai_error(broken, 400)["param"] == "chat_template"


def test_health_and_version(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/version").json()["version"]


@pytest.mark.parametrize("bad", bad_requests(MODEL, 128), ids=lambda bad: bad.name)
def test_bad_input_gets_an_openai_error(http: httpx.Client, bad: BadRequest) -> None:
    if isinstance(bad.body, bytes):
        response = http.request(bad.method, bad.path, content=bad.body, headers={"content-type": "application/json"})
    elif bad.body is None:
        response = http.request(bad.method, bad.path)
    else:
        response = http.request(bad.method, bad.path, json=bad.body)
    error = assert_openai_error(response, bad.status_code)
    if bad.param is not None:
        assert error["param"] == bad.param, error
    if bad.message_mentions is not None:
        assert bad.message_mentions in error["message"], error


def test_server_is_healthy_after_bad_inputs(http: httpx.Client, engine: FakeEngine) -> None:
    for bad in bad_requests(MODEL, 128):
        if isinstance(bad.body, dict):
            http.request(bad.method, bad.path, json=bad.body)
    assert http.get("/health").status_code == 200
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert response.status_code == 200
    assert not engine.running


def test_engine_refusal_is_a_400_streaming_or_not(http: httpx.Client, engine: FakeEngine) -> None:
    engine.rejection = ValueError("this request needs 99 KV blocks but the cache has 8")
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3}
        error = assert_openai_error(http.post("/v1/completions", json=body), 400)
        assert "99 KV blocks" in error["message"]
        streamed = assert_openai_error(http.post("/v1/completions", json={**body, "stream": True}), 400)
        assert "99 KV blocks" in streamed["message"]
    finally:
        engine.rejection = None
    assert http.get("/debug/engine").json()["server_num_waiting"] == 0


def test_body_over_the_limit_is_refused_with_413(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "x" * (MAX_BODY_BYTES + 1)}
    assert_openai_error(http.post("/v1/completions", json=body), 413)

    def chunked():
        yield b'{"prompt": "'
        for _ in range(MAX_BODY_BYTES // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    response = http.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert_openai_error(response, 413)


def test_full_waiting_room_answers_503_with_retry_after(server: ThreadedServer, engine: FakeEngine) -> None:
    engine.hold()
    results: list[int] = []

    def send() -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as own:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
            results.append(own.post("/v1/completions", json=body).status_code)

    threads = [threading.Thread(target=send) for _ in range(MAX_WAITING)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while server_waiting(server) < MAX_WAITING and time.monotonic() < deadline:
            time.sleep(0.01)
        response = httpx.post(f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": "x"})
        error = assert_openai_error(response, 503)
        assert response.headers["retry-after"] == "2"
        assert error["type"] == "server_overloaded"
    finally:
        engine.release()
        for thread in threads:
            thread.join(timeout=30)
    assert results == [200] * MAX_WAITING
    assert server_waiting(server) == 0


def server_waiting(server: ThreadedServer) -> int:
    return httpx.get(f"{server.base_url}/debug/engine").json()["server_num_waiting"]


def test_client_disconnect_mid_stream_aborts_the_request(server: ThreadedServer, engine: FakeEngine) -> None:
    engine.step_s = 0.05
    try:
        num_aborted = len(engine.aborted)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 100, "stream": True}  # 5 s of generation
        with httpx.Client(base_url=server.base_url, timeout=30) as own, own.stream("POST", "/v1/completions", json=body) as response:
            next(response.iter_lines())
        deadline = time.monotonic() + 3
        while len(engine.aborted) == num_aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(engine.aborted) == num_aborted + 1
        assert engine.aborted[-1].startswith("cmpl-")
        assert not engine.running
    finally:
        engine.step_s = 0.005


def test_client_giving_up_on_a_whole_answer_aborts_the_request(server: ThreadedServer, engine: FakeEngine) -> None:
    engine.step_s = 0.05
    try:
        num_aborted = len(engine.aborted)
        body = {"model": MODEL, "prompt": "y", "max_tokens": 120}  # 6 s of generation
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=0.3)
        deadline = time.monotonic() + 3
        while len(engine.aborted) == num_aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(engine.aborted) == num_aborted + 1
        assert engine.aborted[-1].startswith("cmpl-")
        assert not engine.running
    finally:
        engine.step_s = 0.005


def test_metrics_use_vllm_names_under_the_ember_prefix(http: httpx.Client) -> None:
    http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
    text = http.get("/metrics").text
    for name in (
        "ember:num_requests_running",
        "ember:num_requests_waiting",
        "ember:kv_cache_usage_perc",
        "ember:prefix_cache_queries_total",
        "ember:prefix_cache_hits_total",
        "ember:num_preemptions_total",
        "ember:prompt_tokens_total",
        "ember:generation_tokens_total",
        "ember:spec_decode_num_draft_tokens_total",
        "ember:spec_decode_num_accepted_tokens_total",
        "ember:spec_decode_draft_time_seconds_total",
        "ember:spec_decode_verify_time_seconds_total",
        "ember:spec_decode_acceptance_rate",
        "ember:spec_decode_mean_accepted_length",
        "ember:time_to_first_token_seconds_bucket",
        "ember:time_per_output_token_seconds_bucket",
        "ember:e2e_request_latency_seconds_bucket",
        'ember:request_success_total{finished_reason="length",model_name="fake-model"}',
    ):
        assert name in text, name


def test_two_apps_in_one_process_keep_their_own_metrics() -> None:
    first = build_app(FakeEngine(), ServerConfig(served_model_names=["one"]))
    second = build_app(FakeEngine(), ServerConfig(served_model_names=["two"]))
    assert first.state.context.metrics.registry is not second.state.context.metrics.registry
    assert b'model_name="one"' in first.state.context.metrics.render()
    assert b'model_name="one"' not in second.state.context.metrics.render()


def test_an_api_key_guards_the_v1_routes_and_leaves_health_open(engine: FakeEngine) -> None:
    from openai import AuthenticationError

    app = build_app(engine, ServerConfig(api_keys=("sk-first", "sk-second")))
    with ThreadedServer(app) as guarded, httpx.Client(base_url=guarded.base_url, timeout=30) as http:
        for key in ("sk-first", "sk-second"):
            keyed = OpenAI(base_url=f"{guarded.base_url}/v1", api_key=key, max_retries=0)
            assert keyed.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3).choices
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=f"{guarded.base_url}/v1", api_key="sk-wrong", max_retries=0).models.list()
        for headers in ({}, {"Authorization": "sk-first"}, {"Authorization": "Basic sk-first"}):
            refused = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=headers)
            assert assert_openai_error(refused, 401)["code"] == "invalid_api_key"
            assert refused.headers["WWW-Authenticate"] == "Bearer"
        assert http.get("/health").status_code == 200 and http.get("/metrics").status_code == 200


def test_bookkeeping_fields_clients_send_are_accepted_and_change_nothing(client: OpenAI) -> None:
    bookkeeping = {"user": "u-1", "metadata": {"run": "7"}, "store": False, "service_tier": "auto",
                   "safety_identifier": "hashed-user", "prompt_cache_key": "session-3"}  # fmt: skip
    hello = [{"role": "user", "content": "Hi"}]
    plain = client.chat.completions.create(model=MODEL, messages=hello, max_tokens=5).choices[0].message.content
    kept = client.chat.completions.create(model=MODEL, messages=hello, max_tokens=5, extra_body=bookkeeping)
    assert kept.choices[0].message.content == plain
    completion = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, extra_body=bookkeeping)
    assert completion.choices[0].text == client.completions.create(model=MODEL, prompt="Hi", max_tokens=5).choices[0].text
