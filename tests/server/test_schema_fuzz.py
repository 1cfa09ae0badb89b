"""Schema fuzzing: requests generated from the server's own /openapi.json never get a 5xx, and every
answer is one the document lists.

Given the tiny model's real server, when schemathesis sends bodies that fit each route's schema
and bodies that break it (wrong types, missing or unknown fields, out-of-range values), then
every answer is a 2xx or a 4xx, its status code and content type are ones the published document
gives for that route, and every 4xx carries the OpenAI error body with a code.
Generation lengths are clamped to a few tokens so the fuzz stays fast, and a generated model
name is dropped (it would make nearly every request a 404); every other field is free.
"""

from __future__ import annotations

from collections import Counter

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from tests.server.harness import ServeProcess

MAX_EXAMPLES = 15  # per route and mode (valid, invalid)
MAX_GENERATED_TOKENS = 8
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")


def test_no_generated_request_gets_a_5xx(tiny_server: ServeProcess) -> None:
    api = schemathesis.openapi.from_url(f"{tiny_server.base_url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses", "POST /tokenize"} <= {op.label for op in operations}
    statuses: Counter[int] = Counter()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(operation, mode, statuses)
    print(f"schema fuzz: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    assert not [status for status in statuses if status >= 500]
    assert statuses[200] > 0 and sum(count for status, count in statuses.items() if 400 <= status < 500) > 0


def _fuzz(operation, mode: GenerationMode, statuses: Counter[int]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        _clamp_generation_length(case.body)
        response = case.call_and_validate(checks=[not_a_server_error, status_code_conformance, content_type_conformance],
                                          timeout=120)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (operation.label, mode, case.body, response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error["code"], str) and error["code"], error
            assert error["message"], error

    try:
        run()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE, operation.label  # a route with no inputs has none to break


def _clamp_generation_length(body: object) -> None:
    """At most a few generated tokens per request (time, not coverage: larger values mean longer
    runs), and the served model (a random name would stop every request at the model check)."""
    if not isinstance(body, dict):
        return
    for name in LENGTH_FIELDS:
        value = body.get(name)
        if type(value) is int and value > MAX_GENERATED_TOKENS:
            body[name] = MAX_GENERATED_TOKENS
    if isinstance(body.get("model"), str):
        del body["model"]  # a random model name is a 404 before anything else is looked at
    if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_GENERATED_TOKENS  # a chat request otherwise runs to the context window
