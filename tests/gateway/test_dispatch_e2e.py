"""The gateway on loopback in front of real HTTP backends that answer, fail, stall or die:
round-robin, retries, the circuit breaker, fallbacks, and the never-retry-after-first-token rule."""

from __future__ import annotations

import httpx
import openai
import pytest

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict
from tests.gateway.backends import Behaviour, FakeBackend
from tests.gateway.harness import ThreadedApp
from tests.server.harness import assert_openai_error, parse_sse


def gateway_config(backends: list[FakeBackend], tmp_path, **overrides) -> dict:
    config = {
        "backends": [{"name": b.name, "url": b.url, "first_token_timeout_s": 1.0, "timeout_s": 5} for b in backends],
        "models": [{"name": "m", "aliases": ["m-alias"], "backends": [b.name for b in backends]}],
        "retry": {"max_attempts": 4, "backoff_base_s": 0.01, "backoff_max_s": 0.05},
        "breaker": {"failure_threshold": 1, "cooldown_s": 60},
        "store": {"path": str(tmp_path / "gw.sqlite3")},
        "observability": {"trace_exporter": "memory"},
    }
    config.update(overrides)
    return config


@pytest.fixture
def four_backends():
    with FakeBackend("a") as a, FakeBackend("b") as b, FakeBackend("bad", Behaviour("fail")) as bad, FakeBackend(
        "stuck", Behaviour("stall")
    ) as stuck:
        yield a, b, bad, stuck


def test_every_request_succeeds_while_one_backend_fails_and_one_stalls(four_backends, tmp_path):
    a, b, bad, stuck = four_backends
    app = build_app(config_from_dict(gateway_config([a, bad, stuck, b], tmp_path)))
    with ThreadedApp(app) as gateway:
        client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="none", max_retries=0)
        answers = []
        for index in range(8):
            messages = [{"role": "user", "content": f"question {index}"}]
            if index % 2:
                answers.append(client.chat.completions.create(model="m-alias", messages=messages, max_tokens=8).choices[0].message.content)
            else:
                stream = client.chat.completions.create(model="m", messages=messages, max_tokens=8, stream=True)
                answers.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
        metrics = httpx.get(gateway.base_url + "/metrics").text
    assert all(answer.split()[1:] == ["says:", "question", str(index)] for index, answer in enumerate(answers))
    assert {answer.split()[0] for answer in answers} == {"a", "b"}
    # Each bad backend was tried once, then its breaker (threshold 1, long cooldown) kept it out.
    assert bad.record.requests == 1 and stuck.record.requests == 1
    assert 'ember_gateway_backend_breaker_open{backend="bad"} 1.0' in metrics
    assert 'ember_gateway_backend_attempts_total{backend="stuck",outcome="retryable_error"} 1.0' in metrics


def test_round_robin_alternates_between_healthy_backends(tmp_path):
    with FakeBackend("a") as a, FakeBackend("b") as b, ThreadedApp(build_app(config_from_dict(gateway_config([a, b], tmp_path)))) as gateway:
        for index in range(6):
            body = {"model": "m", "prompt": f"p{index}", "max_tokens": 4}
            assert httpx.post(gateway.base_url + "/v1/completions", json=body).status_code == 200
    assert (a.record.requests, b.record.requests) == (3, 3)


def test_a_stream_that_dies_after_its_first_token_is_not_retried(tmp_path):
    with FakeBackend("dies", Behaviour("die_mid_stream", tokens_before_stall=2)) as dies, FakeBackend("b") as b:
        config = gateway_config([dies, b], tmp_path, models=[{"name": "m", "backends": ["dies", "b"], "routing": "least_outstanding"}])
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            body = {"model": "m", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 8, "stream": True}
            response = httpx.post(gateway.base_url + "/v1/chat/completions", json=body, timeout=10)
    events = parse_sse(response.text)
    assert response.status_code == 200 and events[-1] == "[DONE]"
    contents = [e["choices"][0]["delta"].get("content") for e in events[:-2] if e.get("choices")]
    assert "".join(c or "" for c in contents) == "dies says:"
    assert events[-2]["error"]["code"] == "backend_failed"
    assert (dies.record.requests, b.record.requests) == (1, 0)


def test_fallback_model_serves_when_every_backend_of_the_first_fails(tmp_path):
    with FakeBackend("bad", Behaviour("fail")) as bad, FakeBackend("spare") as spare:
        config = gateway_config(
            [bad, spare], tmp_path,
            models=[{"name": "main", "backends": ["bad"], "fallbacks": ["backup"]}, {"name": "backup", "backends": ["spare"]}],
        )  # fmt: skip
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            body = {"model": "main", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
            response = httpx.post(gateway.base_url + "/v1/chat/completions", json=body)
            spans = gateway.app.state.gateway.tracing.memory.get_finished_spans()
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "spare says: hello"
    assert spare.record.bodies[0]["model"] == "backup"
    request_span = next(span for span in spans if span.name == "gateway.request")
    attempts = [span for span in spans if span.name == "gateway.attempt"]
    assert [span.attributes["backend"] for span in attempts] == ["bad", "spare"]
    assert all(span.parent.span_id == request_span.context.span_id for span in attempts)
    assert [span.attributes["outcome"] for span in attempts] == ["retryable_error", "ok"]


def test_client_errors_pass_through_and_are_not_retried(tmp_path):
    with FakeBackend("a") as a, FakeBackend("b") as b:
        config = gateway_config([a, b], tmp_path, models=[{"name": "m", "backends": ["a", "b"], "upstream_model": "reject-me"}])
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            messages = [{"role": "user", "content": "hi"}]
            response = httpx.post(gateway.base_url + "/v1/chat/completions", json={"model": "m", "messages": messages})
            unknown = httpx.post(gateway.base_url + "/v1/chat/completions", json={"model": "nope", "messages": messages})
            not_json = httpx.post(gateway.base_url + "/v1/chat/completions", content=b"{")
    assert assert_openai_error(response, 400)["code"] == "x"
    assert a.record.requests + b.record.requests == 1
    assert assert_openai_error(unknown, 404)["code"] == "model_not_found"
    assert assert_openai_error(not_json, 400)["code"] == "invalid_json"


def test_all_backends_down_is_a_502_with_an_openai_body(tmp_path):
    with FakeBackend("bad", Behaviour("fail")) as bad, ThreadedApp(build_app(config_from_dict(gateway_config([bad], tmp_path)))) as gateway:
        first = httpx.post(gateway.base_url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        cooling = httpx.post(gateway.base_url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
    assert assert_openai_error(first, 502)["code"] == "backend_unavailable"
    assert assert_openai_error(cooling, 503)["code"] == "backend_unavailable"
    assert bad.record.requests == 1


def test_embeddings_and_models_pass_through(tmp_path):
    with FakeBackend("a") as a, ThreadedApp(build_app(config_from_dict(gateway_config([a], tmp_path)))) as gateway:
        client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="none", max_retries=0)
        embedding = client.embeddings.create(model="m", input=["one two", "three"])
        models = [model.id for model in client.models.list()]
    assert [item.embedding for item in embedding.data] == [[7.0, 1.0], [5.0, 1.0]]
    assert embedding.usage.prompt_tokens == 3
    assert models == ["m", "m-alias"]
