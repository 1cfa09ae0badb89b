"""The server's HTTP behaviour over the real engine (a tiny random model, in this process): formats, errors,
overload, limits, metrics.

Given an app built by `build_app` around the engine and served by uvicorn in a thread, when a client sends
requests, then responses follow the OpenAI format exactly and nothing leaks.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from openai import OpenAI

from ember.server import ServerConfig, build_app
from tests.server.bad_inputs import BadRequest, bad_requests, send
from tests.server.harness import ThreadedServer, assert_openai_error, parse_sse
from tests.server.real_engine import (
    GREEDY,
    MODEL,
    RecordingEngine,
    tiny_app,
    tiny_engine,
    wait_until_idle,
)

MAX_WAITING = 4
MAX_BODY_BYTES = 64 * 1024
CONTEXT = 256
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(engine: RecordingEngine):
    with ThreadedServer(tiny_app(engine, max_waiting=MAX_WAITING, max_body_bytes=MAX_BODY_BYTES, retry_after_s=2,
                                  disconnect_poll_s=0.01)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: ThreadedServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def client(server: ThreadedServer) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def test_models_lists_the_served_model(client: OpenAI) -> None:
    assert [model.id for model in client.models.list().data] == [MODEL]


def test_chat_answers_with_usage_counted_by_the_tokenizer(client: OpenAI, engine: RecordingEngine) -> None:
    response = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=7, temperature=0,
                                              extra_body={"ignore_eos": True, "request_id": "usage"})  # fmt: skip
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason == "length"
    prompt = engine.tokenizer.encode("<|user|>Hi\n<|assistant|>")
    assert engine.only("chatcmpl-usage").prompt_token_ids == prompt
    assert response.usage.prompt_tokens == len(prompt)
    assert response.usage.completion_tokens == 7
    assert response.usage.total_tokens == response.usage.prompt_tokens + 7
    assert response.usage.prompt_tokens_details.cached_tokens == 0


def test_streamed_chat_reassembles_to_the_whole_answer(client: OpenAI) -> None:
    fields = {"model": MODEL, "messages": HI, "max_tokens": 9, "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**fields).choices[0].message.content
    chunks = list(client.chat.completions.create(**fields, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9


def test_explicit_nulls_mean_defaults(http: httpx.Client) -> None:
    nulls = dict.fromkeys(
        ["n", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
         "min_tokens", "ignore_eos", "stream", "stream_options", "user", "logit_bias", "logprobs", "top_logprobs",
         "max_completion_tokens", "tools", "tool_choice", "response_format", "add_generation_prompt"]
    )  # fmt: skip
    body = {"model": MODEL, "messages": HI, "max_tokens": 2, **GREEDY}
    response = http.post("/v1/chat/completions", json={**body, **nulls})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


def test_stream_ends_with_done(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, **GREEDY}
    response = http.post("/v1/completions", json={**body, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    whole = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert "".join(event["choices"][0]["text"] for event in events[:-1]) == whole


def test_completions_with_two_prompts_and_n_two_index_choices_by_prompt(client: OpenAI, engine: RecordingEngine) -> None:
    fields = {"model": MODEL, "max_tokens": 4, "extra_body": {"ignore_eos": True}, **GREEDY}
    response = client.completions.create(prompt=["a", "b"], n=2, **fields)
    assert sorted(choice.index for choice in response.choices) == [0, 1, 2, 3]
    alone = [client.completions.create(prompt=prompt, **fields).choices[0].text for prompt in ("a", "b")]
    assert [choice.text for choice in sorted(response.choices, key=lambda c: c.index)] == [alone[0], alone[0], alone[1], alone[1]]
    assert response.usage.completion_tokens == 16
    assert response.usage.prompt_tokens == len(engine.tokenizer.encode("a", add_special_tokens=True)) * 2


def test_streamed_completions_of_two_prompts_interleave_and_count_usage(client: OpenAI) -> None:
    fields = {"model": MODEL, "prompt": ["a", "b"], "n": 2, "max_tokens": 3, "extra_body": {"ignore_eos": True}, **GREEDY}
    whole = {choice.index: choice.text for choice in client.completions.create(**fields).choices}
    texts: dict[int, str] = {}
    chunks = list(client.completions.create(**fields, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == whole
    assert chunks[-1].usage.completion_tokens == 12


def test_completions_accept_token_ids(client: OpenAI, engine: RecordingEngine) -> None:
    by_ids = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=2, **GREEDY, extra_body={"request_id": "ids"})
    assert engine.only("cmpl-ids").prompt_token_ids == [104, 105]
    assert by_ids.usage.prompt_tokens == 2


def test_echo_puts_each_prompt_before_every_choice_of_it_streamed_or_not(client: OpenAI, engine: RecordingEngine) -> None:
    fields = {"model": MODEL, "prompt": ["ab", "cd"], "n": 2, "max_tokens": 3, **GREEDY}
    plain = {choice.index: choice.text for choice in client.completions.create(**fields).choices}
    response = client.completions.create(**fields, echo=True)
    texts = {choice.index: choice.text for choice in response.choices}
    assert texts == {index: ("ab" if index < 2 else "cd") + plain[index] for index in range(4)}
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(**fields, echo=True, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == texts
    by_ids = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=2, echo=True, **GREEDY)
    generated = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=2, **GREEDY).choices[0].text
    assert by_ids.choices[0].text == engine.tokenizer.decode([104, 105]) + generated  # token ids echo as their text


def test_a_stop_string_ends_the_text_before_it_with_finish_reason_stop(client: OpenAI) -> None:
    fields = {"model": MODEL, "prompt": "x", "max_tokens": 20, "extra_body": {"ignore_eos": True}, **GREEDY}
    free = client.completions.create(**fields).choices[0].text
    stop = free[6:9]  # three characters from inside the free text
    stopped = client.completions.create(**fields, stop=[stop]).choices[0]
    assert stopped.text == free[: free.index(stop)]
    assert stopped.finish_reason == "stop"


def test_chat_logprobs_carry_top_alternatives(client: OpenAI) -> None:
    response = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, logprobs=True, top_logprobs=3, **GREEDY,
                                              extra_body={"ignore_eos": True})  # fmt: skip
    content = response.choices[0].logprobs.content
    assert len(content) == 3 and "".join(entry.token for entry in content) == response.choices[0].message.content
    for entry in content:  # greedy: the chosen token is the likeliest, first of its alternatives
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob) and entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or not entry.token.isprintable()


def test_completion_logprobs_use_the_legacy_format(client: OpenAI) -> None:
    choice = client.completions.create(model=MODEL, prompt="x", max_tokens=3, logprobs=2, **GREEDY,
                                       extra_body={"ignore_eos": True}).choices[0]  # fmt: skip
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text and len(logprobs.tokens) == 3
    assert all(value <= 0 for value in logprobs.token_logprobs)
    assert logprobs.text_offset == [0, len(logprobs.tokens[0]), len(logprobs.tokens[0]) + len(logprobs.tokens[1])]
    assert all(len(top) == 2 for top in logprobs.top_logprobs)


def test_tokenize_and_detokenize_round_trip(http: httpx.Client, engine: RecordingEngine) -> None:
    tokens = http.post("/tokenize", json={"prompt": "hé"}).json()
    assert tokens["tokens"] == engine.tokenizer.encode("hé", add_special_tokens=True) and tokens["count"] == len(tokens["tokens"])
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "hé"}
    chat = http.post("/tokenize", json={"messages": HI}).json()
    assert chat["tokens"] == engine.tokenizer.encode("<|user|>Hi\n<|assistant|>")


def rendered(http: httpx.Client, **body) -> str:
    """The prompt /tokenize renders for a chat body, as text."""
    answer = http.post("/tokenize", json=body)
    assert answer.status_code == 200, answer.text
    return http.post("/detokenize", json={"tokens": answer.json()["tokens"]}).json()["prompt"]


def test_vllm_rendering_fields_continue_the_last_turn_and_reach_the_template(http: httpx.Client, engine: RecordingEngine) -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    assert rendered(http, messages=history, continue_final_message=True) == "<|user|>Hi\n<|assistant|>Hel"
    assert rendered(http, messages=history) == "<|user|>Hi\n<|assistant|>Hel\n<|assistant|>"
    assert rendered(http, messages=history, add_generation_prompt=False) == "<|user|>Hi\n<|assistant|>Hel\n"
    reply = http.post("/v1/chat/completions", json={"messages": history, "max_tokens": 3, "continue_final_message": True})
    assert reply.status_code == 200
    assert reply.json()["usage"]["prompt_tokens"] == len(engine.tokenizer.encode("<|user|>Hi\n<|assistant|>Hel"))


def test_a_trusted_server_renders_with_the_template_a_request_brings(engine: RecordingEngine) -> None:
    source = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if shout %}!{% endif %}"
    with ThreadedServer(tiny_app(engine, trust_request_chat_template=True)) as trusted, \
            httpx.Client(base_url=trusted.base_url, timeout=30) as http:  # fmt: skip
        assert rendered(http, messages=HI, chat_template=source) == "[Hi]"
        assert rendered(http, messages=HI, chat_template=source, chat_template_kwargs={"shout": True}) == "[Hi]!"
        assert rendered(http, messages=HI) == "<|user|>Hi\n<|assistant|>"  # the server's own otherwise
        broken = http.post("/v1/chat/completions", json={"messages": HI, "chat_template": "{% for %}"})
        assert assert_openai_error(broken, 400)["param"] == "chat_template"


def test_health_and_version(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/version").json()["version"]


@pytest.mark.parametrize("bad", bad_requests(MODEL, CONTEXT), ids=lambda bad: bad.name)
def test_bad_input_gets_an_openai_error(http: httpx.Client, bad: BadRequest) -> None:
    error = assert_openai_error(send(http, bad), bad.status_code)
    if bad.param is not None:
        assert error["param"] == bad.param, error
    if bad.message_mentions is not None:
        assert bad.message_mentions in error["message"], error


def test_server_is_healthy_after_bad_inputs(http: httpx.Client, engine: RecordingEngine) -> None:
    for bad in bad_requests(MODEL, CONTEXT):
        if isinstance(bad.body, dict):
            http.request(bad.method, bad.path, json=bad.body)
    assert http.get("/health").status_code == 200
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert response.status_code == 200
    assert wait_until_idle(engine)


def test_an_engine_refusal_is_a_400_naming_the_field_streaming_or_not(http: httpx.Client, engine: RecordingEngine) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "logit_bias": {str(engine.limits.vocab_size): 1}}
    for streams in (False, True):
        error = assert_openai_error(http.post("/v1/completions", json={**body, "stream": streams}), 400)
        assert error["param"] == "logit_bias" and str(engine.limits.vocab_size - 1) in error["message"]
    too_long = {"model": MODEL, "messages": HI, "max_completion_tokens": CONTEXT}
    error = assert_openai_error(http.post("/v1/chat/completions", json=too_long), 400)
    assert (error["param"], error["code"]) == ("max_completion_tokens", "context_length_exceeded")
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


def test_full_waiting_room_answers_503_with_retry_after(tiny_model_dir, smollm2_tokenizer_dir) -> None:
    """One request runs at a time, so the next MAX_WAITING wait in the engine's queue and fill the room."""
    engine = tiny_engine(tiny_model_dir, smollm2_tokenizer_dir, max_model_len=1024, max_num_seqs=1)
    long = {"model": MODEL, "prompt": "x", "max_tokens": 400, "ignore_eos": True}
    results: list[int] = []
    try:
        with ThreadedServer(tiny_app(engine, max_waiting=MAX_WAITING, retry_after_s=2)) as server:

            def send() -> None:
                with httpx.Client(base_url=server.base_url, timeout=60) as own:
                    results.append(own.post("/v1/completions", json=long).status_code)

            threads = [threading.Thread(target=send) for _ in range(MAX_WAITING + 1)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 20
            while server_waiting(server) < MAX_WAITING and time.monotonic() < deadline:
                time.sleep(0.01)
            response = httpx.post(f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": "x"})
            error = assert_openai_error(response, 503)
            assert response.headers["retry-after"] == "2"
            assert error["type"] == "server_overloaded"
            for thread in threads:
                thread.join(timeout=60)
            assert server_waiting(server) == 0
    finally:
        engine.shutdown()
    assert results == [200] * (MAX_WAITING + 1)


def server_waiting(server: ThreadedServer) -> int:
    return httpx.get(f"{server.base_url}/debug/engine").json()["server_num_waiting"]


def test_client_disconnect_mid_stream_aborts_the_request(server: ThreadedServer, engine: RecordingEngine) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": CONTEXT - 10, "ignore_eos": True, "stream": True, "request_id": "left"}
    with httpx.Client(base_url=server.base_url, timeout=30) as own, own.stream("POST", "/v1/completions", json=body) as response:
        next(response.iter_lines())
    assert wait_until_idle(engine)
    assert [request_id for request_id in engine.aborted if request_id.startswith("cmpl-left")]


def test_client_giving_up_on_a_whole_answer_aborts_the_request(server: ThreadedServer, engine: RecordingEngine) -> None:
    body = {"model": MODEL, "prompt": "y", "max_tokens": CONTEXT - 10, "ignore_eos": True, "request_id": "gave-up"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=0.05)
    assert wait_until_idle(engine)
    assert [request_id for request_id in engine.aborted if request_id.startswith("cmpl-gave-up")]


def test_metrics_use_vllm_names_under_the_ember_prefix(http: httpx.Client) -> None:
    http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3, "ignore_eos": True})
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
        f'ember:request_success_total{{finished_reason="length",model_name="{MODEL}"}}',
    ):
        assert name in text, name


def test_two_apps_in_one_process_keep_their_own_metrics(engine: RecordingEngine) -> None:
    first = build_app(engine, ServerConfig(served_model_names=["one"]))
    second = build_app(engine, ServerConfig(served_model_names=["two"]))
    assert first.state.context.metrics.registry is not second.state.context.metrics.registry
    assert b'model_name="one"' in first.state.context.metrics.render()
    assert b'model_name="one"' not in second.state.context.metrics.render()


def test_an_api_key_guards_the_v1_routes_and_leaves_health_open(engine: RecordingEngine) -> None:
    from openai import AuthenticationError

    with ThreadedServer(tiny_app(engine, api_keys=("sk-first", "sk-second"))) as guarded, \
            httpx.Client(base_url=guarded.base_url, timeout=30) as http:  # fmt: skip
        for key in ("sk-first", "sk-second"):
            keyed = OpenAI(base_url=f"{guarded.base_url}/v1", api_key=key, max_retries=0)
            assert keyed.chat.completions.create(model=MODEL, messages=HI, max_tokens=3).choices
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
    plain = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, **GREEDY).choices[0].message.content
    kept = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, **GREEDY, extra_body=bookkeeping)
    assert kept.choices[0].message.content == plain
    completion = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, **GREEDY, extra_body=bookkeeping)
    assert completion.choices[0].text == client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, **GREEDY).choices[0].text


def test_embeddings_are_checked_whole_before_any_input_runs_and_name_the_input(http: httpx.Client, engine: RecordingEngine) -> None:
    before = len(engine.requests)
    refused = http.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2], [engine.limits.vocab_size]]})
    assert assert_openai_error(refused, 400)["param"] == "input"
    assert len(engine.requests) == before + 1  # the first was checked and made, never run: nothing waits or runs
    assert wait_until_idle(engine)
    answered = http.post("/v1/embeddings", json={"model": MODEL, "input": ["a b", "c"]})
    assert answered.status_code == 200 and [len(item["embedding"]) for item in answered.json()["data"]] == [64, 64]
