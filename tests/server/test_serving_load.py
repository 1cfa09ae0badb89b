"""A real `serve` process under load: batching across HTTP requests, disconnects, bad input, metrics.

Given one server on the SmolLM2 GGUF, when many clients stream at once, cut their streams, or send
malformed requests, then requests share engine steps, nothing leaks, and the server stays healthy.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import jsonschema
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.server.bad_inputs import bad_requests, send
from tests.server.harness import SERVED_MODEL, ServeProcess, assert_openai_error

PROMPTS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "Write a haiku about the sea.",
    "What is 2 + 2?",
]
MAX_TOKENS = 12


def metric(base_url: str, name: str) -> float:
    """The value of one unlabelled-by-reason `ember:` metric from /metrics."""
    text = httpx.get(f"{base_url}/metrics").text
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


def wait_until_idle(base_url: str, timeout_s: float = 30.0) -> dict:
    """Engine stats once nothing runs or waits and no KV block is in use (fails after timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = httpx.get(f"{base_url}/debug/engine").json()["stats"]
        is_idle = stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_cache_usage"] == 0
        if is_idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def chat(content: str) -> dict:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }


@pytest.fixture(scope="module")
def solo_answers(smollm2_server: ServeProcess) -> dict[str, str]:
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    return {prompt: client.chat.completions.create(**chat(prompt)).choices[0].message.content for prompt in PROMPTS}


def test_sixteen_concurrent_streams_share_steps_and_match_solo_greedy(
    smollm2_server: ServeProcess, solo_answers: dict[str, str]
) -> None:
    prompts = [PROMPTS[index % len(PROMPTS)] for index in range(16)]

    async def stream_one(client: AsyncOpenAI, prompt: str) -> tuple[str, str]:
        stream = await client.chat.completions.create(**chat(prompt), stream=True)
        request_id, text = "", ""
        async for chunk in stream:
            request_id = chunk.id
            text += "".join(choice.delta.content or "" for choice in chunk.choices)
        return request_id, text

    async def stream_all() -> list[tuple[str, str]]:
        client = AsyncOpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=300)
        async with client:
            return await asyncio.gather(*(stream_one(client, prompt) for prompt in prompts))

    results = asyncio.run(stream_all())
    for prompt, (_, text) in zip(prompts, results, strict=True):
        assert text == solo_answers[prompt], prompt
    ours = {request_id for request_id, _ in results}
    records = httpx.get(f"{smollm2_server.base_url}/debug/engine").json()["step_records"]
    most_together = max(len(ours.intersection(record["request_ids"])) for record in records)
    assert most_together > 1, "no engine step ran two of the concurrent requests together"
    stats = wait_until_idle(smollm2_server.base_url)
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_streams_cut_after_the_first_chunk_return_every_block(smollm2_server: ServeProcess) -> None:
    base_url = smollm2_server.base_url
    body = {**chat("Tell me a long story about a dragon."), "max_tokens": 400, "stream": True}

    async def cut(index: int) -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            request = {**body, "messages": [{"role": "user", "content": f"Story {index}: a long tale of a dragon."}]}
            async with client.stream("POST", "/v1/chat/completions", json=request) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if '"content":"' in line and '"role"' not in line:
                        return  # the first generated chunk: hang up

    async def cut_all() -> None:
        await asyncio.gather(*(cut(index) for index in range(8)))

    asyncio.run(cut_all())
    stats = wait_until_idle(base_url)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["kv_cache_usage"] == 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert metric(base_url, "ember:kv_cache_usage_perc") == 0
    assert metric(base_url, "ember:num_requests_running") == 0
    assert 'finished_reason="abort"' in httpx.get(f"{base_url}/metrics").text


def test_bad_inputs_get_openai_errors_and_leave_the_server_healthy(smollm2_server: ServeProcess) -> None:
    base_url = smollm2_server.base_url
    max_model_len = httpx.get(f"{base_url}/v1/models").json()["data"][0]["max_model_len"]
    table = bad_requests(SERVED_MODEL, max_model_len)
    assert len(table) >= 20
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for bad in table:
            error = assert_openai_error(send(client, bad), bad.status_code)
            if bad.param is not None:
                assert error["param"] == bad.param, (bad.name, error)
        assert client.get("/health").status_code == 200
        response = client.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": "Hello", "max_tokens": 2})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
        assert_openai_error(client.post("/v1/completions", content=b"x" * (5 * 2**20)), 413)


def test_metrics_count_tokens_and_latencies(smollm2_server: ServeProcess) -> None:
    base_url = smollm2_server.base_url
    assert metric(base_url, "ember:prompt_tokens_total") > 0
    assert metric(base_url, "ember:generation_tokens_total") > 0
    assert metric(base_url, "ember:prefix_cache_queries_total") >= metric(base_url, "ember:prefix_cache_hits_total") > 0
    assert metric(base_url, "ember:time_to_first_token_seconds_count") > 0
    assert metric(base_url, "ember:time_per_output_token_seconds_count") > 0
    assert metric(base_url, "ember:e2e_request_latency_seconds_count") > 0
    text = httpx.get(f"{base_url}/metrics").text
    assert re.search(r'ember:request_success_total\{finished_reason="(length|stop)"', text)
    assert "ember:num_preemptions_total" in text and "ember:num_requests_waiting" in text


def test_logit_bias_reaches_the_sampler_through_the_openai_client(smollm2_server: ServeProcess) -> None:
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    forced = httpx.post(f"{smollm2_server.base_url}/tokenize", json={"prompt": " banana"}).json()["tokens"][-1]
    reply = client.completions.create(
        model=SERVED_MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logit_bias={str(forced): 100}
    )
    assert reply.choices[0].text == " banana" * 4


def test_echo_returns_the_prompt_and_scores_its_tokens_streamed_or_not(smollm2_server: ServeProcess) -> None:
    """How evaluation harnesses read a text's log-likelihood: echo=True with logprobs over the /v1/completions API."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    prompt = "The capital of France is"
    prompt_ids = httpx.post(f"{smollm2_server.base_url}/tokenize", json={"prompt": prompt}).json()["tokens"]
    options = dict(model=SERVED_MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    whole = client.completions.create(**options).choices[0]
    plain = client.completions.create(**{**options, "echo": False}).choices[0]
    assert whole.text == prompt + plain.text
    logprobs = whole.logprobs
    assert len(logprobs.tokens) == len(prompt_ids) + 3
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing came before it
    for position in range(1, len(prompt_ids) + 3):
        chosen, top = logprobs.token_logprobs[position], logprobs.top_logprobs[position]
        # the 2 likeliest and, as OpenAI's legacy format has it, the scored token when it is not among them
        assert chosen <= 0.0 and top[logprobs.tokens[position]] == chosen and len(top) in (2, 3)
        assert len(top) == 2 or chosen < min(value for token, value in top.items() if token != logprobs.tokens[position])
    assert logprobs.token_logprobs[len(prompt_ids):] == plain.logprobs.token_logprobs
    assert logprobs.text_offset[len(prompt_ids)] == len(prompt)
    streamed = list(client.completions.create(**options, stream=True))
    assert "".join(chunk.choices[0].text for chunk in streamed) == whole.text
    assert [t for chunk in streamed for t in chunk.choices[0].logprobs.token_logprobs] == logprobs.token_logprobs


def test_vllm_prompt_logprobs_cache_salt_and_bad_words_through_the_openai_client(smollm2_server: ServeProcess) -> None:
    """vLLM's prompt_logprobs score the prompt as echo's logprobs do; a cache_salt keeps a prefix to its own salt;
    bad_words keep a word out of a greedy reply."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    prompt = "The capital of France is"
    options = dict(model=SERVED_MODEL, prompt=prompt, max_tokens=2, temperature=0)
    echoed = client.completions.create(**options, echo=True, logprobs=1).choices[0].logprobs
    scored = client.completions.create(**options, extra_body={"prompt_logprobs": 1}).model_dump()["choices"][0]["prompt_logprobs"]
    prompt_ids = httpx.post(f"{smollm2_server.base_url}/tokenize", json={"prompt": prompt}).json()["tokens"]
    assert len(scored) == len(prompt_ids) and scored[0] is None
    for position, token_id in enumerate(prompt_ids[1:], start=1):
        entry = scored[position][str(token_id)]  # the prompt's own token, with its rank; then the likeliest other
        assert entry["logprob"] == pytest.approx(echoed.token_logprobs[position], abs=1e-5)
        assert entry["rank"] >= 1 and len(scored[position]) in (1, 2)
        assert any(other["rank"] == 1 for other in scored[position].values())
    salted = dict(model=SERVED_MODEL, prompt="The tallest mountain of the Alps is " * 8, max_tokens=1)
    cached = [client.completions.create(**salted, extra_body={"cache_salt": salt}).usage.prompt_tokens_details.cached_tokens
              for salt in ("alice", "bob", "alice")]  # fmt: skip
    assert cached[0] == cached[1] == 0 and cached[2] > 0  # through the engine process: shared only under one salt
    free = client.completions.create(**{**options, "max_tokens": 1}).choices[0].text  # " Paris"
    held = client.completions.create(**{**options, "max_tokens": 1}, extra_body={"bad_words": [free.strip()]}).choices[0].text
    assert free.strip() and held.strip() != free.strip()


def test_embeddings_through_the_openai_client_in_both_encodings(smollm2_server: ServeProcess) -> None:
    """The openai client asks for base64 and decodes it; the floats asked for plainly are the same, unit-length."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    texts = ["The capital of France is Paris.", "A cat sat on the mat."]
    packed = client.embeddings.create(model=SERVED_MODEL, input=texts)
    plain = httpx.post(f"{smollm2_server.base_url}/v1/embeddings", json={"input": texts, "encoding_format": "float"}).json()
    assert [item.index for item in packed.data] == [0, 1]
    for ours, floats in zip(packed.data, plain["data"], strict=True):
        assert ours.embedding == pytest.approx(floats["embedding"], abs=1e-6)
        assert sum(value * value for value in floats["embedding"]) == pytest.approx(1.0, abs=1e-4)
    assert packed.data[0].embedding != pytest.approx(packed.data[1].embedding, abs=1e-3)
    counted = sum(len(httpx.post(f"{smollm2_server.base_url}/tokenize", json={"prompt": text}).json()["tokens"]) for text in texts)
    assert packed.usage.prompt_tokens == counted
    refused = httpx.post(f"{smollm2_server.base_url}/v1/embeddings", json={"input": "x", "dimensions": 8})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "dimensions"


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}  # fmt: skip


def test_response_format_holds_the_reply_to_json_through_the_openai_client(smollm2_server: ServeProcess) -> None:
    """OpenAI's structured outputs: a json_schema reply validates (jsonschema), a json_object reply streams as it returns."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Describe a software engineer named Ada as JSON with fields name, age, languages."}]
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}
    reply = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=200, temperature=0,
                                           response_format=schema_format).choices[0]  # fmt: skip
    assert reply.finish_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content), PERSON_SCHEMA)
    options = dict(model=SERVED_MODEL, messages=[{"role": "user", "content": "Give me JSON about a cat."}], max_tokens=120,
                   temperature=0.7, seed=5, response_format={"type": "json_object"})  # fmt: skip
    whole = client.chat.completions.create(**options).choices[0]
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(**options, stream=True) if chunk.choices)
    assert streamed == whole.message.content
    assert whole.message.content.lstrip().startswith("{")
    if whole.finish_reason == "stop":
        assert isinstance(json.loads(whole.message.content), dict)


def test_vllm_guided_choice_json_and_regex_through_extra_body(smollm2_server: ServeProcess) -> None:
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    choices = ["positive", "negative", "neutral"]
    messages = [{"role": "user", "content": "Classify the sentiment: 'I love this phone, it is wonderful.'"}]
    for temperature in (0.0, 1.0):
        reply = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=10, temperature=temperature,
                                               extra_body={"guided_choice": choices}).choices[0]  # fmt: skip
        assert reply.message.content in choices and reply.finish_reason == "stop"
    schema = {"type": "object", "properties": {"sentiment": {"enum": choices}, "confidence": {"type": "number"}},
              "required": ["sentiment", "confidence"], "additionalProperties": False}  # fmt: skip
    reply = client.completions.create(model=SERVED_MODEL, prompt="Sentiment of 'great phone' as JSON:", max_tokens=40, temperature=0,
                                      extra_body={"guided_json": json.dumps(schema)}).choices[0]  # fmt: skip
    assert reply.finish_reason == "stop"
    jsonschema.validate(json.loads(reply.text), schema)
    pattern = r"\d{3}-\d{3}-\d{4}"
    reply = client.completions.create(model=SERVED_MODEL, prompt="A phone number:", max_tokens=20, temperature=0.8, seed=1,
                                      extra_body={"guided_regex": pattern}).choices[0]  # fmt: skip
    assert reply.finish_reason == "stop" and re.fullmatch(pattern, reply.text), reply.text


def test_vllm_structured_outputs_field_holds_the_reply_as_the_guided_fields_do(smollm2_server: ServeProcess) -> None:
    """vLLM's newer spelling (`structured_outputs`): a choice, and compact JSON (disable_any_whitespace) of a schema."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    choices = ["yes", "no"]
    reply = client.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user", "content": "Is Paris in France?"}],
                                           max_tokens=5, temperature=0, extra_body={"structured_outputs": {"choice": choices}}).choices[0]  # fmt: skip
    assert reply.message.content in choices and reply.finish_reason == "stop"
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "facts": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
              "required": ["city", "facts"], "additionalProperties": False}  # fmt: skip
    compact = {"structured_outputs": {"json": schema, "disable_any_whitespace": True}}
    reply = client.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user", "content": "Two facts about Paris, as JSON."}],
                                           max_tokens=120, temperature=0.8, seed=3, extra_body=compact).choices[0]  # fmt: skip
    assert reply.finish_reason == "stop", reply
    jsonschema.validate(json.loads(reply.message.content), schema)
    assert not re.search(r"\s", re.sub(r'"(\\.|[^"\\])*"', "", reply.message.content)), reply.message.content


def test_continue_final_message_goes_on_writing_the_assistant_turn(smollm2_server: ServeProcess) -> None:
    """The reply continues the given text exactly as a completion of the prompt /tokenize renders for it."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    history = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "The capital of France is"}]
    continued = client.chat.completions.create(model=SERVED_MODEL, messages=history, max_tokens=6, temperature=0,
                                               extra_body={"continue_final_message": True}).choices[0]  # fmt: skip
    prompt = httpx.post(f"{smollm2_server.base_url}/tokenize", json={"messages": history, "continue_final_message": True}).json()
    completed = client.completions.create(model=SERVED_MODEL, prompt=prompt["tokens"], max_tokens=6, temperature=0).choices[0]
    assert continued.message.content == completed.text and "Paris" in continued.message.content


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                               "required": ["city", "unit"], "additionalProperties": False}}}  # fmt: skip


def test_forced_tool_calls_come_back_as_openai_tool_calls_whole_or_streamed(smollm2_server: ServeProcess) -> None:
    """A named tool_choice and "required" hold the reply to the calls' JSON, so even a 135M model calls correctly."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    parameters = WEATHER_TOOL["function"]["parameters"]
    for tool_choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        options = dict(model=SERVED_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=80, temperature=0)
        reply = client.chat.completions.create(**options).choices[0]
        assert reply.finish_reason == "tool_calls", reply
        call = reply.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), parameters)
        streamed = [chunk.choices[0] for chunk in client.chat.completions.create(**options, stream=True) if chunk.choices]
        deltas = [c.delta.tool_calls[0] for c in streamed if c.delta.tool_calls]
        assert "".join(d.function.arguments for d in deltas) == call.function.arguments  # named: piece by piece
        assert deltas[0].function.name == "get_weather" and deltas[0].id and all(d.id is None for d in deltas[1:])
        assert streamed[-1].finish_reason == "tool_calls"
    answered = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                           {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]  # fmt: skip
    final = client.chat.completions.create(model=SERVED_MODEL, messages=answered, tools=[WEATHER_TOOL], max_tokens=20, temperature=0)
    assert final.choices[0].message.content and final.choices[0].finish_reason in ("stop", "length")


def test_the_responses_api_answers_text_json_and_tool_calls_through_the_openai_client(smollm2_server: ServeProcess) -> None:
    """OpenAI's Responses API on the real model: plain text (whole, and streamed with the client's helper), a
    `text.format` JSON schema held token by token, and a forced call returned as a function_call item."""
    client = OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    options = dict(model=SERVED_MODEL, input="What is the capital of France?", max_output_tokens=40, temperature=0)
    whole = client.responses.create(**options)
    assert whole.status == "completed" and "Paris" in whole.output_text
    with client.responses.stream(**options) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    schema = PERSON_SCHEMA
    text_format = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    person = client.responses.create(model=SERVED_MODEL, input="Describe a software engineer named Ada as JSON.", max_output_tokens=200,
                                      temperature=0, text=text_format)  # fmt: skip
    assert person.status == "completed"
    jsonschema.validate(json.loads(person.output_text), schema)
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    called = client.responses.create(model=SERVED_MODEL, input="What is the weather in Paris?", tools=[tool], tool_choice="required",
                                      max_output_tokens=80, temperature=0)  # fmt: skip
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), tool["parameters"])
    answered = client.responses.create(model=SERVED_MODEL, tools=[tool], max_output_tokens=20, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"}, calls[0].model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 18}'}])  # fmt: skip
    assert answered.output_text
