"""Schema-driven fuzz of the gateway: 2,000 generated requests (fixed seed) over every route,
shaped like the request models with any JSON value (NaN, huge integers, deep nesting, wrong
types) in any field, plus raw non-JSON bodies, against a real gateway with keys, a budget, the
cache and prefix routing on. No answer may be a 5xx, and the gateway serves normally after."""

from __future__ import annotations

import json

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict, hash_key
from tests.gateway.harness import ThreadedApp

EXAMPLES = 2000
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def fixed_backend() -> FastAPI:
    """A backend that answers every request with the same valid answer, whatever the body (the
    fuzz tests the gateway, not the backend): JSON, or a short stream when `stream` is true."""
    app = FastAPI()

    def answer(endpoint: str) -> dict:
        if endpoint == "responses":
            usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
            return {"id": "resp_1", "object": "response", "status": "completed", "output": [], "usage": usage}
        if endpoint == "embeddings":
            return {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 1.0]}], "usage": USAGE}
        choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}, "text": "ok"}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": USAGE}

    async def events(endpoint: str):
        if endpoint == "responses":
            final = {"type": "response.completed", "response": answer("responses")}
            yield f"data: {json.dumps({'type': 'response.output_text.delta', 'delta': 'ok'})}\n\ndata: {json.dumps(final)}\n\n"
        else:
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ok"}, "text": "ok", "finish_reason": "stop"}]}
            yield f"data: {json.dumps(chunk)}\n\ndata: {json.dumps({'id': 'x', 'choices': [], 'usage': USAGE})}\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/{endpoint:path}")
    async def serve(endpoint: str, request: Request):
        body = await request.json()
        endpoint = endpoint.split("/")[-1]
        if body.get("stream") is True and endpoint != "embeddings":
            return StreamingResponse(events(endpoint), media_type="text/event-stream")
        return JSONResponse(answer(endpoint))

    return app


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(), st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    SCALARS, lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3), max_leaves=8
)


def either(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """A field's value: one the model accepts 9 times in 10, else any JSON value at all."""
    return st.integers(0, 9).flatmap(lambda draw: JSON_VALUES if draw == 0 else plausible)


MODEL = either(st.sampled_from(["m", "m", "m-alias", "nope"]))
PARTS = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image_url"]), "text": either(st.text(max_size=20))}), max_size=3)
CONTENT = either(st.one_of(st.text(max_size=40), PARTS))
MESSAGES = either(st.lists(st.fixed_dictionaries({"role": either(st.sampled_from(["user", "system", "assistant"])), "content": CONTENT}), min_size=1, max_size=3))
TEXTS = either(st.one_of(st.text(max_size=40), st.lists(st.text(max_size=10), min_size=1, max_size=3), st.lists(st.integers(0, 500), min_size=1, max_size=4)))
CAP = either(st.integers(-1, 40))
SAMPLING = {"temperature": either(st.sampled_from([0, 0.0, 0.7, 2])), "stream": either(st.booleans()), "user": either(st.text(max_size=6)),
            "stream_options": either(st.fixed_dictionaries({"include_usage": either(st.booleans())})), "metadata": JSON_VALUES}
ROUTE_BODIES = {
    "/v1/chat/completions": ({"model": MODEL, "messages": MESSAGES}, {**SAMPLING, "max_tokens": CAP, "max_completion_tokens": CAP, "n": either(st.integers(0, 3))}),
    "/v1/completions": ({"model": MODEL, "prompt": TEXTS}, {**SAMPLING, "max_tokens": CAP, "n": either(st.integers(0, 3)), "best_of": either(st.integers(0, 3)), "echo": either(st.booleans())}),
    "/v1/responses": ({"model": MODEL, "input": either(st.one_of(st.text(max_size=40), st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": CONTENT}), max_size=2)))},
                      {**SAMPLING, "max_output_tokens": CAP, "instructions": either(st.text(max_size=20)), "previous_response_id": either(st.text(max_size=8))}),
    "/v1/embeddings": ({"model": MODEL, "input": TEXTS}, {"metadata": JSON_VALUES}),
    "/v1/messages": ({"model": MODEL, "max_tokens": CAP, "messages": MESSAGES},
                     {"system": CONTENT, "stop_sequences": either(st.lists(st.text(max_size=4), max_size=2)), "temperature": either(st.floats(0, 1)), "stream": either(st.booleans())}),
    "/admin/keys/revoke": ({"key_sha256": either(st.text(max_size=64))}, {}),
}  # fmt: skip
SHAPED = st.one_of(*(st.tuples(st.just(route), st.fixed_dictionaries(required, optional=optional).map(lambda body: json.dumps(body).encode()))
                     for route, (required, optional) in ROUTE_BODIES.items()))  # fmt: skip
RAW = st.one_of(
    st.binary(max_size=40),
    st.integers(1, 3000).map(lambda depth: b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
)
REQUESTS = st.tuples(st.one_of(SHAPED, SHAPED, SHAPED, st.tuples(st.sampled_from(list(ROUTE_BODIES)), RAW)), st.booleans())


def test_two_thousand_generated_requests_get_no_5xx_and_the_gateway_stays_up(tmp_path):
    backend = ThreadedApp(fixed_backend())
    with backend:
        config = {
            "backends": [{"name": "a", "url": backend.base_url + "/v1"}, {"name": "b", "url": backend.base_url + "/v1", "continuous_usage": True}],
            "models": [{"name": "m", "aliases": ["m-alias"], "backends": ["a", "b"], "routing": "prefix_aware",
                        "price": {"input_per_million": 1.0, "output_per_million": 2.0}}],
            "keys": [{"name": "k", "key_sha256": hash_key("sk-k"), "budget_usd": 100.0, "tpm": 10**9}],
            "admin_key_sha256": hash_key("sk-admin"),
            "cache": {"enabled": True, "cache_sampled": True},
            "limits": {"max_body_bytes": 65536, "max_json_depth": 32},
            "store": {"path": str(tmp_path / "gw.sqlite3")},
        }  # fmt: skip
        with ThreadedApp(build_app(config_from_dict(config))) as gateway, httpx.Client(base_url=gateway.base_url, timeout=30) as client:
            statuses: list[int] = []

            @seed(20261207)
            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(REQUESTS)
            def one_request(request):
                (route, content), is_admin = request
                headers = {"authorization": "Bearer " + ("sk-admin" if is_admin else "sk-k"), "content-type": "application/json"}
                response = client.post(route, content=content, headers=headers)
                statuses.append(response.status_code)
                assert response.status_code < 500, (route, content[:300], response.status_code, response.text[:300])

            one_request()
            health = client.get("/health")
            after = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                                headers={"authorization": "Bearer sk-k"})  # fmt: skip
    assert len(statuses) >= EXAMPLES
    assert health.status_code == 200 and after.status_code == 200, after.text
    assert statuses.count(200) >= EXAMPLES // 10 and statuses.count(400) >= EXAMPLES // 10  # both valid and invalid bodies got through
