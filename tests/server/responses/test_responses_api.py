"""`POST /v1/responses` over the real engine: the Responses API's objects and stream events as the `openai`
client reads them, its input items as the conversation they amount to, its refusals as named 400s."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from ember.server.responses.conversion import chat_messages
from ember.server.responses.models import ResponsesRequest
from tests.server.harness import ThreadedServer, assert_openai_error, parse_sse
from tests.server.real_engine import MODEL, RecordingEngine, tiny_app


@pytest.fixture(scope="module")
def server(engine: RecordingEngine):
    with ThreadedServer(tiny_app(engine)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ThreadedServer) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def chat_reply(client: OpenAI, messages: list[dict], max_tokens: int) -> str:
    """The greedy chat reply the same conversation gets."""
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0).choices[0].message.content


def test_a_response_carries_its_text_status_and_usage_as_the_client_reads_them(client: OpenAI, engine: RecordingEngine) -> None:
    response = client.responses.create(model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=9, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL
    assert response.output_text == chat_reply(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], 9)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    prompt = "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    assert response.usage.input_tokens == len(engine.tokenizer.encode(prompt))
    assert response.usage.output_tokens == 9 and response.usage.total_tokens == response.usage.input_tokens + 9
    assert response.instructions == "Be brief." and response.max_output_tokens == 9 and response.temperature == 0


def test_a_streamed_response_is_numbered_typed_events_ending_with_the_whole_response(client: OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=7, temperature=0, stream=True))
    expected = chat_reply(client, [{"role": "user", "content": "Hi"}], 7)
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert "".join(event.delta for event in deltas) == expected
    assert len({event.item_id for event in deltas}) == 1 and deltas[0].item_id == events[2].item.id
    final = events[-1].response
    assert final.output_text == expected and final.usage.output_tokens == 7 and final.id == events[0].response.id
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_input_items_become_the_conversation_calls_and_results_included() -> None:
    request = ResponsesRequest.model_validate({"instructions": "Use tools.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city": "Lyon"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_2", "output": "20C"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris 18C.", "annotations": []}]},
    ]})  # fmt: skip
    assert chat_messages(request) == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "20C"},
        {"role": "assistant", "content": "Paris 18C."},
    ]  # fmt: skip


def test_a_history_with_tool_results_is_served(client: OpenAI) -> None:
    tool = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    response = client.responses.create(model=MODEL, tools=[tool], max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ])  # fmt: skip
    assert response.usage.output_tokens == 4 and response.tools[0].name == "weather" and response.tool_choice == "auto"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "Hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": []}, "input"),
    ({"input": "Hi", "frobnicate": 1}, "frobnicate"),
    ({"input": [{"type": "image", "url": "x"}]}, "input"),
    ({"input": "Hi", "max_output_tokens": 10_000}, "max_output_tokens"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "format": "idn-email"}}}}, "text.format"),
    ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
])  # fmt: skip
def test_what_ember_cannot_serve_is_a_400_naming_the_responses_field(server: ThreadedServer, body: dict, param: str) -> None:
    answer = httpx.post(f"{server.base_url}/v1/responses", json={"model": MODEL, **body}, timeout=30)
    error = assert_openai_error(answer, 400)
    assert error["param"] is not None and error["param"].startswith(param), error


def test_a_streamed_response_sends_every_event_as_typed_sse(server: ThreadedServer) -> None:
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 3,
                                                                       "stream": True}, timeout=30) as answer:  # fmt: skip
        body = "".join(answer.iter_text())
    names = [line.removeprefix("event: ") for line in body.splitlines() if line.startswith("event: ")]
    payloads = [p for p in parse_sse(body) if p != "[DONE]"]
    assert names == [p["type"] for p in payloads] and names[-1] == "response.incomplete"
