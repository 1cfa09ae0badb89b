"""Serving reliability over the real engine (a tiny model, in this process): no 5xx from tokenizer failures,
quiet client disconnects, deadlines for slow clients, the OpenAPI document, and a waiting room
that counts only requests not yet scheduled.

Given an app of `build_app` served by uvicorn in a thread (with `ember serve`'s uvicorn
settings), when clients misbehave or tokenizers fail, then every answer is a 4xx or a 2xx.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest

from tests.server.harness import ThreadedServer, assert_openai_error
from tests.server.real_engine import RecordingEngine, tiny_app, tiny_engine

SLOW_CLIENT_TIMEOUT_S = 1.0
MAX_WAITING = 4
CONTEXT = 2048  # the tiny model's own: a stream long enough to outlast the body deadline
UNENCODABLE = "\U0005cab3"  # a valid scalar value the SmolLM2 GGUF vocabulary once encoded as [None]
TOKENIZER_CRASH = "\x07"


class FlakyTokenizer:
    """The engine's tokenizer with two bugs put in: ids of None for one character, an exception for another
    (the server's side of a tokenizer failure; everything else goes to the real tokenizer)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if TOKENIZER_CRASH in text:
            raise RuntimeError("internal tokenizer bug")
        ids = self.tokenizer.encode(text.replace(UNENCODABLE, ""), add_special_tokens)
        return [*ids, None] if UNENCODABLE in text else ids


@pytest.fixture(scope="module")
def engine(tiny_model_dir, smollm2_tokenizer_dir):
    """Room for every request of a burst to run at once, and the server reading prompts with a flaky tokenizer."""
    recording = RecordingEngine(tiny_engine(tiny_model_dir, smollm2_tokenizer_dir, max_model_len=CONTEXT, max_num_seqs=16))
    recording.tokenizer = FlakyTokenizer(recording.engine.tokenizer)
    yield recording
    recording.shutdown()


@pytest.fixture(scope="module")
def server(engine: RecordingEngine):
    app = tiny_app(engine, max_waiting=MAX_WAITING, header_timeout_s=SLOW_CLIENT_TIMEOUT_S, body_timeout_s=SLOW_CLIENT_TIMEOUT_S)
    with ThreadedServer(app) as running:
        yield running


@pytest.fixture
def http(server: ThreadedServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


@pytest.mark.parametrize("text", [UNENCODABLE, f"a{TOKENIZER_CRASH}b"], ids=["ids-of-none", "exception"])
@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", lambda text: {"prompt": text, "max_tokens": 1}),
        ("/v1/completions", lambda text: {"prompt": ["ok", text], "max_tokens": 1, "stream": True}),
        ("/v1/chat/completions", lambda text: {"messages": [{"role": "user", "content": text}], "max_tokens": 1}),
        ("/tokenize", lambda text: {"prompt": text}),
    ],
    ids=["completion", "streamed-batch", "chat", "tokenize"],
)
def test_a_tokenizer_failure_is_a_400_naming_the_prompt(http: httpx.Client, path: str, body, text: str) -> None:
    error = assert_openai_error(http.post(path, json=body(text)), 400)
    assert error["code"] == "unprocessable_prompt"
    assert error["param"] in ("prompt", "messages")
    assert http.get("/debug/engine").json()["server_num_held"] == 0


def test_client_gone_while_sending_the_body_is_an_info_line_not_an_error(
    server: ThreadedServer, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(caplog.handler)  # uvicorn's loggers do not propagate to the root
    caplog.set_level(logging.INFO)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(_headers("POST", "/v1/completions", content_length=1000) + b'{"prompt": "')
            time.sleep(0.2)
        deadline = time.monotonic() + 5
        while not _disconnect_lines(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        uvicorn_errors.removeHandler(caplog.handler)
    assert _disconnect_lines(caplog), caplog.text
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == [], caplog.text
    assert http.get("/health").status_code == 200


def _disconnect_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if "client disconnected while sending" in record.getMessage()]


def test_a_client_that_never_finishes_its_headers_is_disconnected(server: ThreadedServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(SLOW_CLIENT_TIMEOUT_S + 5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")  # and nothing more
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server, not timed out here
    assert time.monotonic() - started < SLOW_CLIENT_TIMEOUT_S + 2


def test_an_idle_connection_that_sends_nothing_is_disconnected(server: ThreadedServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(SLOW_CLIENT_TIMEOUT_S + 5)
        assert sock.recv(1024) == b""


def test_a_body_that_arrives_too_slowly_gets_408(server: ThreadedServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(SLOW_CLIENT_TIMEOUT_S + 5)
        sock.sendall(_headers("POST", "/v1/completions", content_length=100) + b'{"prompt"')
        reply = _read_response(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"code":"request_timeout"' in reply


def test_a_stream_longer_than_the_body_deadline_is_not_cut(http: httpx.Client) -> None:
    """The body deadline covers the upload only, not the generation that follows it."""
    body = {"prompt": "hi", "max_tokens": CONTEXT - 8, "ignore_eos": True, "stream": True}
    started = time.monotonic()
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert time.monotonic() - started > SLOW_CLIENT_TIMEOUT_S  # it did outlast the deadline
    assert lines[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in lines[-2]
    assert not any('"error"' in line for line in lines)


def test_a_burst_within_the_engine_capacity_is_admitted_whole(engine: RecordingEngine) -> None:
    """12 requests at once with --max-waiting 4 and room for 16 to run: none waits to be scheduled, so none is
    refused (before: each counted as waiting until its first token, so 8 got 503). Default client
    deadlines here: a busy machine may take over a second to send a burst's headers."""
    with ThreadedServer(tiny_app(engine, max_waiting=MAX_WAITING)) as server:
        statuses = asyncio.run(_burst(server.base_url, 3 * MAX_WAITING))
    assert statuses == [200] * (3 * MAX_WAITING)


async def _burst(base_url: str, count: int) -> list[int]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        body = {"prompt": "hi", "max_tokens": 2}
        responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(count)))
    return [response.status_code for response in responses]


def test_openapi_describes_the_real_request_bodies(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    chat_body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat_body["schema"] == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    chat = schemas["ChatCompletionRequest"]
    assert "messages" in chat["required"] and chat["additionalProperties"] is False
    assert {"n", "temperature", "stop", "seed", "max_completion_tokens"} <= set(chat["properties"])
    completion_body = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert completion_body["schema"] == {"$ref": "#/components/schemas/CompletionRequest"}
    assert set(schemas["ErrorDetail"]["required"]) == {"message", "type", "param", "code"}
    assert _dangling_refs(document) == []


def test_openapi_lists_what_the_routes_answer(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    paths = document["paths"]
    for path, method in (("/v1/responses/{response_id}", "get"), ("/v1/responses/{response_id}", "delete"),
                         ("/v1/responses/{response_id}/input_items", "get")):
        assert {"200", "400", "404"} <= set(paths[path][method]["responses"]), (path, method)
    assert not [path for path, operations in paths.items() for operation in operations.values() if "422" in operation["responses"]]
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert http.get("/metrics").headers["content-type"].startswith("text/plain")
    missing = http.get("/v1/responses/resp_missing")
    assert str(missing.status_code) in paths["/v1/responses/{response_id}"]["get"]["responses"]
    assert assert_openai_error(missing, 404)["code"] == "response_not_found"
    bad_order = http.get("/v1/responses/resp_missing/input_items", params={"limit": "many"})
    assert assert_openai_error(bad_order, 400)["param"] == "query.limit"


def _dangling_refs(node: object, document: dict | None = None) -> list[str]:
    document = document if document is not None else node
    if isinstance(node, dict):
        found = []
        target = node.get("$ref")
        if isinstance(target, str):
            name = target.removeprefix("#/components/schemas/")
            if name not in document["components"]["schemas"]:
                found.append(target)
        for value in node.values():
            found += _dangling_refs(value, document)
        return found
    if isinstance(node, list):
        return [ref for item in node for ref in _dangling_refs(item, document)]
    return []


def test_docs_page_is_served(http: httpx.Client) -> None:
    response = http.get("/docs")
    assert response.status_code == 200
    assert "openapi.json" in response.text


def _headers(method: str, path: str, content_length: int) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {content_length}\r\n\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data
