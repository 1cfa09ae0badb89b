"""`POST /v1/responses` through the gateway: ember's own server (on the real engine, a tiny model) and test backends
behind it, read with the `openai` client. Whole and streamed responses, their billing from the
Responses API's usage (budgets, token limits, a stream cut by its client), retries before the first
delta but not after, the cache for whole responses only, and models whose backends speak only
Anthropic's Messages API refused by name."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from ember.gateway.accounting import (
    completion_token_bound,
    prompt_text,
    prompt_token_bound,
    with_completion_limit,
)
from ember.gateway.app import build_app
from ember.gateway.config import AccountingConfig, config_from_dict, hash_key
from ember.gateway.sqlite_store import SQLiteStore
from ember.gateway.store import window_of
from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import ThreadedApp
from tests.server.harness import ThreadedServer, assert_openai_error, parse_sse
from tests.server.real_engine import MODEL, tiny_app, tiny_engine

KEY = "sk-k"


@pytest.fixture(scope="module")
def engine(tiny_model_dir, smollm2_tokenizer_dir):
    """The real engine over the tiny model, shared by the module's ember servers."""
    engine = tiny_engine(tiny_model_dir, smollm2_tokenizer_dir)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def ember(engine):
    """ember's server (its real /v1/responses) on the real engine."""
    with ThreadedServer(tiny_app(engine)) as server:
        yield server


def gateway_config(tmp_path, backends: list[dict], **overrides) -> dict:
    config = {
        "backends": [{"first_token_timeout_s": 2, "timeout_s": 5, **backend} for backend in backends],
        "models": [{"name": "m", "backends": [backend["name"] for backend in backends], "upstream_model": MODEL,
                    "price": {"input_per_million": 1.0, "output_per_million": 2.0}}],  # fmt: skip
        "keys": [{"name": "k", "key_sha256": hash_key(KEY)}],
        "retry": {"max_attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.02},
        "breaker": {"failure_threshold": 1, "cooldown_s": 60},
        "store": {"path": str(tmp_path / "gw.sqlite3")},
    }
    config.update(overrides)
    return config


def ember_gateway(ember: ThreadedServer, tmp_path, **overrides) -> ThreadedApp:
    return ThreadedApp(build_app(config_from_dict(gateway_config(tmp_path, [{"name": "ember", "url": ember.base_url + "/v1"}], **overrides))))


def client_of(gateway: ThreadedApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=KEY, max_retries=0)


def ledger(tmp_path) -> list[tuple[str, int, int, int]]:
    """(status, prompt tokens, completion tokens, cost) of each settled request of the key."""
    store = SQLiteStore(str(tmp_path / "gw.sqlite3"))
    try:
        rows = asyncio.run(store.ledger(hash_key(KEY)))
    finally:
        asyncio.run(store.close())
    return [(row.status, row.prompt_tokens, row.completion_tokens, row.cost_nano_usd) for row in rows]


def prompt_tokens(engine, *turns: tuple[str, str]) -> int:
    """The engine's prompt tokens for a conversation: its rendered chat template, tokenized."""
    return len(engine.tokenizer.encode("".join(f"<|{role}|>{text}\n" for role, text in turns) + "<|assistant|>"))


def test_a_response_is_embers_whole_response_with_the_default_cap_and_is_billed_from_its_usage(ember, engine, tmp_path):
    with ember_gateway(ember, tmp_path, accounting={"default_max_tokens": 6}) as gateway:
        response = client_of(gateway).responses.create(model="m", input="Hi", instructions="Be brief.", temperature=0)
        metrics = httpx.get(gateway.base_url + "/metrics").text
    direct = openai.OpenAI(base_url=ember.base_url + "/v1", api_key="none", max_retries=0).responses.create(
        model=MODEL, input="Hi", instructions="Be brief.", temperature=0, max_output_tokens=6)
    input_tokens = prompt_tokens(engine, ("system", "Be brief."), ("user", "Hi"))
    assert response.object == "response" and response.id.startswith("resp_")
    # The gateway capped the request in the field ember knows (it refuses max_tokens here).
    assert response.max_output_tokens == 6 and response.output_text == direct.output_text and response.status == "incomplete"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (input_tokens, 6)
    assert ledger(tmp_path) == [("ok", input_tokens, 6, input_tokens * 1000 + 6 * 2000)]
    assert f'ember_gateway_tokens_total{{key="k",kind="prompt",model="m"}} {float(input_tokens)}' in metrics
    assert 'ember_gateway_tokens_total{key="k",kind="completion",model="m"} 6.0' in metrics
    assert 'ember_gateway_requests_total{key="k",model="m",status="ok"} 1.0' in metrics


def test_a_streamed_response_arrives_event_by_event_and_is_billed_from_its_final_event(ember, engine, tmp_path):
    with ember_gateway(ember, tmp_path) as gateway:
        events = list(client_of(gateway).responses.create(model="m", input="Hi", max_output_tokens=7, temperature=0, stream=True))
        raw = httpx.post(gateway.base_url + "/v1/responses", json={"model": "m", "input": "Hi", "max_output_tokens": 3, "temperature": 0,
                                                                   "stream": True},
                         headers={"authorization": f"Bearer {KEY}"}, timeout=10)  # fmt: skip
        metrics = httpx.get(gateway.base_url + "/metrics").text
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    direct = openai.OpenAI(base_url=ember.base_url + "/v1", api_key="none", max_retries=0).responses.create(
        model=MODEL, input="Hi", temperature=0, max_output_tokens=7)
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == direct.output_text
    input_tokens = prompt_tokens(engine, ("user", "Hi"))
    assert (events[-1].response.usage.input_tokens, events[-1].response.usage.output_tokens) == (input_tokens, 7)
    # Each event keeps its `event:` line; the stream ends with [DONE] as ember's does.
    assert raw.text.startswith("event: response.created\ndata: ") and parse_sse(raw.text)[-1] == "[DONE]"
    assert [row[:3] for row in ledger(tmp_path)] == [("ok", input_tokens, 7), ("ok", input_tokens, 3)]
    assert 'ember_gateway_tokens_total{key="k",kind="completion",model="m"} 10.0' in metrics


def test_a_budget_admits_responses_by_their_bound_and_settles_them_to_their_usage(ember, engine, tmp_path):
    # Bound: "Hi" is 2 bytes + 16 x 2 template tokens = 34 input, 4 output: 34000 + 8000 = 42000 nano-USD.
    # Used: the rendered template's tokens, 4 output. Settled to that, a budget of 2 x used + bound + half a used admits
    # 3 (2 x used + bound fits, 3 x used + bound does not); settled to the bound it would admit 2.
    used_tokens = prompt_tokens(engine, ("user", "Hi"))
    used = used_tokens * 1000 + 4 * 2000
    assert used < 42000 / 1.5  # the prompt's bound is well above what it uses, or the test would not tell them apart
    keys = [{"name": "k", "key_sha256": hash_key(KEY), "budget_usd": (2.5 * used + 42000) / 1e9}]
    with ember_gateway(ember, tmp_path, keys=keys) as gateway:
        body = {"model": "m", "input": "Hi", "max_output_tokens": 4, "temperature": 0}
        responses = [httpx.post(gateway.base_url + "/v1/responses", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=10)
                     for _ in range(5)]  # fmt: skip
    assert [response.status_code for response in responses] == [200, 200, 200, 429, 429]
    assert assert_openai_error(responses[3], 429)["code"] == "budget_exceeded"
    assert ledger(tmp_path) == [("ok", used_tokens, 4, used)] * 3


def test_a_token_limit_counts_streamed_responses_at_their_final_usage(ember, engine, tmp_path):
    # Bound 34 + 4 = 38 tokens, used (the rendered template's) + 4: a minute of 2 x used + 38 admits 3, not 2 (3 x 38 > it).
    used_tokens = prompt_tokens(engine, ("user", "Hi"))
    keys = [{"name": "k", "key_sha256": hash_key(KEY), "tpm": 2 * (used_tokens + 4) + 38}]
    with ember_gateway(ember, tmp_path, keys=keys) as gateway:
        client = client_of(gateway)
        started = time.time()
        outcomes = []
        for _ in range(4):
            try:
                outcomes.append(list(client.responses.create(model="m", input="Hi", max_output_tokens=4, temperature=0,
                                                             stream=True))[-1].type)  # fmt: skip
            except openai.RateLimitError as error:
                outcomes.append(error.code)
    if window_of(started) != window_of(time.time()):
        pytest.skip("the requests straddled a one-minute rate window boundary; rerun")
    assert outcomes == ["response.incomplete"] * 3 + ["rate_limit_exceeded"]
    assert [row[:3] for row in ledger(tmp_path)] == [("ok", used_tokens, 4)] * 3


def test_a_responses_stream_cut_by_the_client_is_billed_for_the_deltas_it_received(tmp_path):
    with FakeBackend("a", Behaviour("stall_mid_stream", tokens_before_stall=3)) as backend:
        config = gateway_config(tmp_path, [{"name": "a", "url": backend.url, "continuous_usage": True}], accounting={"default_max_tokens": 9})
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            deltas = []
            with client_of(gateway).responses.create(model="m", input="w1 w2 w3 w4 w5", stream=True) as stream:
                for event in stream:
                    deltas += [event.delta] if event.type == "response.output_text.delta" else []
                    if len(deltas) == 3:
                        break  # the backend now stalls; the client gives up and closes the stream
            rows, deadline = [], time.monotonic() + 10
            while not rows and time.monotonic() < deadline:
                time.sleep(0.05)
                rows = ledger(tmp_path)
    assert deltas == ["a", " says:", " w1"]
    # No usage came before the cut: the prompt is billed at its bound, 14 bytes + 16 x 2.
    assert [row[:3] for row in rows] == [("cancelled", 14 + 32, 3)]
    sent = backend.record.bodies[0]
    assert sent["max_output_tokens"] == 9 and "max_tokens" not in sent and "stream_options" not in sent


def test_responses_fail_over_to_a_healthy_backend_until_the_first_delta(tmp_path):
    with FakeBackend("bad", Behaviour("fail")) as bad, FakeBackend("b") as b, \
            FakeBackend("dies", Behaviour("die_mid_stream", tokens_before_stall=0)) as dies:  # fmt: skip
        # Round-robin: the whole response tries bad, then b; the stream (bad cooling down) dies, then b.
        backends = [{"name": backend.name, "url": backend.url} for backend in (bad, b, dies)]
        with ThreadedApp(build_app(config_from_dict(gateway_config(tmp_path, backends)))) as gateway:
            client = client_of(gateway)
            whole = client.responses.create(model="m", input="one two", max_output_tokens=8)
            streamed = list(client.responses.create(model="m", input="three", max_output_tokens=8, stream=True))
    assert whole.output_text == "b says: one two"
    # `dies` sent its opening events, then failed before any delta: the stream went to `b` whole.
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == "b says: three"
    assert [e.sequence_number for e in streamed] == list(range(len(streamed))) and streamed[-1].type == "response.completed"
    assert (bad.record.requests, dies.record.requests, b.record.requests) == (1, 1, 2)


def test_a_responses_stream_that_fails_after_its_first_delta_ends_with_an_error_event(tmp_path):
    with FakeBackend("dies", Behaviour("die_mid_stream", tokens_before_stall=2)) as dies, FakeBackend("b") as b:
        backends = [{"name": backend.name, "url": backend.url} for backend in (dies, b)]
        config = gateway_config(tmp_path, backends, models=[{"name": "m", "backends": ["dies", "b"], "routing": "least_outstanding"}])
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            body = {"model": "m", "input": "one two three", "stream": True}
            response = httpx.post(gateway.base_url + "/v1/responses", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    events = parse_sse(response.text)
    assert "".join(e["delta"] for e in events[:-2] if e.get("type") == "response.output_text.delta") == "dies says:"
    assert events[-2]["error"]["code"] == "backend_failed" and events[-1] == "[DONE]"
    assert (dies.record.requests, b.record.requests) == (1, 0)
    assert [row[:3] for row in ledger(tmp_path)] == [("failed", 13 + 32, 2)]


def test_whole_responses_are_served_from_the_cache_and_streamed_ones_never_are(tmp_path):
    with FakeBackend("a") as backend:
        config = gateway_config(tmp_path, [{"name": "a", "url": backend.url}], cache={"enabled": True})
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            ask = {"model": "m", "instructions": "Be brief.", "input": [{"role": "user", "content": "capital of France?"}],
                   "max_output_tokens": 8, "temperature": 0}  # fmt: skip
            headers = {"authorization": f"Bearer {KEY}"}
            first = httpx.post(gateway.base_url + "/v1/responses", json=ask, headers=headers, timeout=10)
            again = httpx.post(gateway.base_url + "/v1/responses", json={**ask, "input": "capital of France?"}, headers=headers, timeout=10)
            other = httpx.post(gateway.base_url + "/v1/responses", json={**ask, "input": "How many legs has a spider?"}, headers=headers, timeout=10)
            streamed = httpx.post(gateway.base_url + "/v1/responses", json={**ask, "stream": True}, headers=headers, timeout=10)
    # A text input is the same conversation as one user message: the whole response comes back as it was.
    assert again.headers["x-ember-cache"] == "hit" and again.json() == first.json()
    assert "x-ember-cache" not in other.headers and "x-ember-cache" not in streamed.headers
    assert parse_sse(streamed.text)[-2]["type"] == "response.completed"
    assert backend.record.requests == 3
    assert [row[0] for row in ledger(tmp_path)] == ["ok"] * 3  # a hit reserves and bills nothing


def test_models_served_only_by_anthropic_backends_refuse_responses_by_name(tmp_path):
    with FakeBackend("claude", kind="anthropic") as claude, FakeBackend("a") as a:
        backends = [{"name": "claude", "url": claude.url, "kind": "anthropic"}, {"name": "a", "url": a.url}]
        models = [{"name": "claude-x", "backends": ["claude"]}, {"name": "mixed", "backends": ["claude", "a"]}]
        with ThreadedApp(build_app(config_from_dict(gateway_config(tmp_path, backends, models=models)))) as gateway:
            client = client_of(gateway)
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(model="claude-x", input="hello", max_output_tokens=4)
            raw = httpx.post(gateway.base_url + "/v1/responses", json={"model": "claude-x", "input": "hello", "stream": True},
                             headers={"authorization": f"Bearer {KEY}"})  # fmt: skip
            mixed = [client.responses.create(model="mixed", input="hello", max_output_tokens=4).output_text for _ in range(3)]
            chat = client.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    error = assert_openai_error(raw, 400)
    assert error["code"] == "unsupported_endpoint" and error["param"] == "model"
    assert "/v1/responses" in error["message"] and "Anthropic" in error["message"] and "/v1/responses" in str(refused.value)
    # Mixed models route the Responses API to the backends that have it; chat still reaches Claude.
    assert mixed == ["a says: hello"] * 3 and chat.choices[0].message.content == "claude says: hello"
    assert (claude.record.requests, a.record.requests) == (1, 3)
    assert [row[0] for row in ledger(tmp_path)] == ["ok"] * 4  # the refusals reserved nothing


def test_a_responses_conversation_is_bounded_and_routed_like_the_same_chat():
    config = AccountingConfig(template_tokens_per_message=16, default_max_tokens=32)
    body = {"model": "m", "instructions": "Use tools.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ]}  # fmt: skip
    text = "system\nUse tools.\nuser\nWeather in Paris?\nassistant\nweather({\"city\":\"Paris\"})\ntool\n18C\n"
    assert prompt_text("/responses", body) == text
    # Bytes of the turns' texts (10 + 17 + 25 + 3) plus 16 per turn and 16 more.
    assert prompt_token_bound("/responses", body, config) == 55 + 16 * 5
    capped = with_completion_limit("/responses", body, config)
    assert capped["max_output_tokens"] == 32 and "max_tokens" not in capped
    assert completion_token_bound("/responses", {**body, "max_output_tokens": 5}, config) == 5
    chat = {"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Hello"}]}
    assert prompt_text("/responses", {"instructions": "Use tools.", "input": "Hello"}) == prompt_text("/chat/completions", chat)


def test_a_continued_response_reaches_the_server_that_stored_it_and_reads_go_there_too(engine, tmp_path):
    """Two ember servers behind round-robin routing: each keeps only the responses it answered, so continuations
    (whole and streamed) and reads must follow the response; another tenant's key cannot read it."""
    servers = [ThreadedServer(tiny_app(engine)) for _ in range(2)]  # one engine, two servers each with its own store
    with servers[0] as first, servers[1] as second:
        backends = [{"name": "a", "url": first.base_url + "/v1"}, {"name": "b", "url": second.base_url + "/v1"}]
        config = gateway_config(tmp_path, backends)
        config["models"][0]["routing"] = "round_robin"
        config["keys"].append({"name": "other", "key_sha256": hash_key("sk-other"), "tenant": "elsewhere"})
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            client = client_of(gateway)
            response = client.responses.create(model="m", input="My name is Bob.", max_output_tokens=3)
            for turn in range(4):  # round-robin alone would send every other one to the server without it
                if turn % 2:
                    events = list(client.responses.create(model="m", input=f"Turn {turn}.", previous_response_id=response.id,
                                                          max_output_tokens=3, stream=True))  # fmt: skip
                    response = events[-1].response
                else:
                    response = client.responses.create(model="m", input=f"Turn {turn}.", previous_response_id=response.id,
                                                       max_output_tokens=3)  # fmt: skip
                assert response.status in ("completed", "incomplete")
            read = client.responses.retrieve(response.id)
            assert (read.id, read.previous_response_id) == (response.id, response.previous_response_id)
            items = client.responses.input_items.list(response.id, order="asc").data
            assert [item.content[0].text for item in items][0] == "My name is Bob." and len(items) == 9  # 5 inputs, 4 replies
            stranger = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="sk-other", max_retries=0)
            with pytest.raises(openai.NotFoundError):
                stranger.responses.retrieve(response.id)
            deleted = httpx.delete(f"{gateway.base_url}/v1/responses/{response.id}", headers={"authorization": f"Bearer {KEY}"})
            assert deleted.status_code == 200 and deleted.json()["deleted"] is True
            assert_openai_error(httpx.get(f"{gateway.base_url}/v1/responses/{response.id}", headers={"authorization": f"Bearer {KEY}"}), 404)
