"""Stored responses of the Responses API: continued with previous_response_id, read back, listed, deleted, bounded.

Over the real engine (recording each request it is given) and the openai client, as an application keeping a
conversation's state on the server would use them.
"""

from __future__ import annotations

import httpx
import pytest
from openai import NotFoundError, OpenAI

from ember.server.serving.response_store import ResponseStore
from tests.server.harness import ThreadedServer, assert_openai_error
from tests.server.real_engine import MODEL, RecordingEngine, tiny_app


def _serve(engine: RecordingEngine, **settings) -> ThreadedServer:
    return ThreadedServer(tiny_app(engine, **settings))


def _client(server: ThreadedServer) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def _last_prompt(engine: RecordingEngine) -> str:
    return engine.tokenizer.decode(list(engine.requests.values())[-1].prompt_token_ids)


def test_a_continued_response_replays_the_conversation_without_the_old_instructions(engine: RecordingEngine) -> None:
    with _serve(engine) as server:
        client = _client(server)
        first = client.responses.create(model=MODEL, input="My name is Bob.", instructions="Be terse.", max_output_tokens=5)
        assert first.store is True
        second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                         max_output_tokens=5)  # fmt: skip
        assert second.previous_response_id == first.id
        expected = f"<|user|>My name is Bob.\n<|assistant|>{first.output_text}\n<|user|>What is my name?\n<|assistant|>"
        assert _last_prompt(engine) == expected  # instructions are not carried over, as OpenAI's are not
        third = list(client.responses.create(model=MODEL, input="Again.", previous_response_id=second.id,
                                             max_output_tokens=3, stream=True))[-1].response  # fmt: skip
        assert _last_prompt(engine).startswith(expected) and _last_prompt(engine).endswith("<|user|>Again.\n<|assistant|>")
        read = client.responses.retrieve(third.id)
        assert (read.previous_response_id, read.output_text, read.usage.input_tokens) == (second.id, third.output_text,
                                                                                          third.usage.input_tokens)  # fmt: skip


def test_input_items_are_listed_newest_first_by_default_with_paging(engine: RecordingEngine) -> None:
    with _serve(engine) as server:
        client = _client(server)
        first = client.responses.create(model=MODEL, input="one", max_output_tokens=2)
        second = client.responses.create(model=MODEL, input=[{"role": "user", "content": "two"}], previous_response_id=first.id,
                                         max_output_tokens=2)  # fmt: skip
        newest_first = client.responses.input_items.list(second.id).data
        texts = [item.content[0].text for item in newest_first]
        assert texts == ["two", first.output_text, "one"] and newest_first[1].role == "assistant"
        oldest_first = client.responses.input_items.list(second.id, order="asc", limit=2)
        assert [item.id for item in oldest_first.data] == [item.id for item in newest_first[::-1][:2]]
        assert oldest_first.has_more is True
        rest = client.responses.input_items.list(second.id, order="asc", after=oldest_first.data[-1].id)
        assert [item.content[0].text for item in rest.data] == ["two"] and rest.has_more is False


def test_unstored_deleted_and_unknown_responses_are_not_found(engine: RecordingEngine) -> None:
    with _serve(engine) as server:
        client = _client(server)
        kept = client.responses.create(model=MODEL, input="a", max_output_tokens=2)
        unkept = client.responses.create(model=MODEL, input="b", max_output_tokens=2, store=False)
        assert unkept.store is False
        with pytest.raises(NotFoundError):
            client.responses.retrieve(unkept.id)
        deleted = httpx.delete(f"{server.base_url}/v1/responses/{kept.id}").json()
        assert deleted == {"id": kept.id, "object": "response", "deleted": True}
        assert_openai_error(httpx.get(f"{server.base_url}/v1/responses/{kept.id}"), 404)
        assert_openai_error(httpx.delete(f"{server.base_url}/v1/responses/{kept.id}"), 404)
        error = assert_openai_error(httpx.post(f"{server.base_url}/v1/responses", json={"input": "c", "previous_response_id": kept.id}), 400)
        assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"


def test_the_store_keeps_the_newest_responses_only(engine: RecordingEngine) -> None:
    with _serve(engine, max_stored_responses=2) as server:
        client = _client(server)
        ids = [client.responses.create(model=MODEL, input=str(i), max_output_tokens=1).id for i in range(3)]
        with pytest.raises(NotFoundError):
            client.responses.retrieve(ids[0])
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    with _serve(engine, max_stored_responses=0) as server:
        assert _client(server).responses.create(model=MODEL, input="x", max_output_tokens=1).store is False


def test_a_store_on_disk_outlives_its_server(tmp_path) -> None:
    path = str(tmp_path / "responses.sqlite")
    store = ResponseStore(path, max_responses=5)
    store.put({"id": "resp_1", "output": [{"type": "message"}]}, [{"type": "message", "id": "msg_1"}])
    store.close()
    again = ResponseStore(path, max_responses=5).get("resp_1")
    assert again is not None and again.conversation() == [{"type": "message", "id": "msg_1"}, {"type": "message"}]
