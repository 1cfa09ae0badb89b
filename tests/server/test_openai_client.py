"""The official `openai` client against a real `serve` process on SmolLM2-135M-Instruct.

Reference for token counts: the HF `tokenizers` library on the shared SmolLM2 tokenizer.json.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.server.harness import SERVED_MODEL, ServeProcess, assert_openai_error
from tests.shared_assets import shared_file

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def client(smollm2_server: ServeProcess) -> OpenAI:
    return OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference_tokenizer(shared_dir: Path):
    tokenizers = pytest.importorskip("tokenizers")
    path = shared_file(shared_dir, "tokenizers/smollm2/tokenizer.json")
    return tokenizers.Tokenizer.from_file(str(path))


def chatml(messages: list[dict]) -> str:
    """SmolLM2's chat template written out by hand: default system turn, then ChatML turns."""
    text = "" if messages[0]["role"] == "system" else f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for message in messages:
        text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def greedy_capital(client: OpenAI):
    return client.chat.completions.create(model=SERVED_MODEL, messages=CAPITAL, max_tokens=12, temperature=0)


def test_models_lists_the_served_name(client: OpenAI) -> None:
    assert [model.id for model in client.models.list().data] == [SERVED_MODEL]


def test_greedy_chat_answers_paris(greedy_capital) -> None:
    choice = greedy_capital.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert greedy_capital.model == SERVED_MODEL


def test_chat_usage_equals_the_reference_tokenizer_counts(greedy_capital, reference_tokenizer) -> None:
    expected_prompt_tokens = len(reference_tokenizer.encode(chatml(CAPITAL), add_special_tokens=False).ids)
    usage = greedy_capital.usage
    assert usage.prompt_tokens == expected_prompt_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 <= usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens


def test_length_finished_completion_counts_exactly_max_tokens(client: OpenAI, reference_tokenizer) -> None:
    prompt = "The quick brown fox"
    response = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=6, temperature=0)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 6
    assert response.usage.prompt_tokens == len(reference_tokenizer.encode(prompt, add_special_tokens=False).ids)


def test_streamed_chat_reassembles_to_the_greedy_answer(client: OpenAI, greedy_capital) -> None:
    stream = client.chat.completions.create(
        model=SERVED_MODEL,
        messages=CAPITAL,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == greedy_capital.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == greedy_capital.usage.prompt_tokens
    assert usage.completion_tokens == greedy_capital.usage.completion_tokens
    # The same prompt a second time: its full blocks come from the prefix cache.
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_completion_of_text_equals_completion_of_its_token_ids(client: OpenAI, smollm2_server: ServeProcess) -> None:
    prompt = "Once upon a time"
    token_ids = httpx.post(f"{smollm2_server.base_url}/tokenize", json={"prompt": prompt}).json()["tokens"]
    by_text = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=SERVED_MODEL, prompt=token_ids, max_tokens=8, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.choices[0].text.strip()
    detokenized = httpx.post(f"{smollm2_server.base_url}/detokenize", json={"tokens": token_ids}).json()
    assert detokenized["prompt"] == prompt


def test_n_two_returns_two_indexed_choices(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=SERVED_MODEL, messages=CAPITAL, max_tokens=8, temperature=1.0, n=2, seed=3
    )
    assert [choice.index for choice in response.choices] == [0, 1]
    assert all(choice.message.content for choice in response.choices)
    assert response.usage.completion_tokens <= 16


def test_chat_logprobs_rank_the_greedy_token_first(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=SERVED_MODEL, messages=CAPITAL, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert [top.logprob for top in entry.top_logprobs] == sorted((top.logprob for top in entry.top_logprobs), reverse=True)
    assert "".join(entry.token for entry in content) == response.choices[0].message.content


def test_completion_logprobs_use_the_legacy_format(client: OpenAI) -> None:
    response = client.completions.create(model=SERVED_MODEL, prompt="The sky is", max_tokens=4, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0


def test_a_seed_makes_sampling_reproducible(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        response = client.completions.create(
            model=SERVED_MODEL, prompt="My favourite animal is", max_tokens=10, temperature=1.0, seed=seed
        )
        return response.choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert any(sample(seed) != first for seed in (8, 9, 10))


def test_stop_string_ends_the_answer_before_it(client: OpenAI, greedy_capital) -> None:
    assert "Paris" in greedy_capital.choices[0].message.content
    response = client.chat.completions.create(
        model=SERVED_MODEL, messages=CAPITAL, max_tokens=12, temperature=0, stop=["Paris", "\n\n"]
    )
    text = response.choices[0].message.content
    assert response.choices[0].finish_reason == "stop"
    assert "Paris" not in text
    assert greedy_capital.choices[0].message.content.startswith(text)


def test_every_sampling_knob_is_accepted_together(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=SERVED_MODEL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
        ],
        n=3,
        max_completion_tokens=4,
        temperature=0.7,
        top_p=0.9,
        seed=-1,
        stop="\n\n",
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logprobs=True,
        top_logprobs=20,
        user="test-user",
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 4, "ignore_eos": True},
    )
    assert len(response.choices) == 3
    assert all(choice.finish_reason == "length" for choice in response.choices)
    assert response.usage.completion_tokens == 12
    assert all(len(entry.top_logprobs) == 20 for choice in response.choices for entry in choice.logprobs.content)


def test_request_lines_are_logged_without_prompt_text(smollm2_server: ServeProcess) -> None:
    log = smollm2_server.log_text()
    assert "finished request_id=chatcmpl-" in log
    assert "prompt_tokens=" in log and "ttft_s=" in log and "finish_reason=" in log
    assert "capital of France" not in log
    assert "KV cache:" in log and "blocks" in log


def test_completion_top_logprobs_always_hold_the_sampled_token(client: OpenAI) -> None:
    # OpenAI's legacy format: up to logprobs + 1 entries, the sampled token always among them.
    response = client.completions.create(model=SERVED_MODEL, prompt="The sky is", max_tokens=4, temperature=0,
                                         logprobs=0, echo=True)  # fmt: skip
    logprobs = response.choices[0].logprobs
    assert logprobs.top_logprobs[0] is None  # the first prompt token: nothing came before it
    for token, logprob, top in zip(logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True):
        assert top == {token: pytest.approx(logprob)}


def test_a_reply_sent_back_as_its_model_dump_renders_as_its_text(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=SERVED_MODEL, messages=CAPITAL, max_tokens=4, temperature=0)
    dumped = reply.choices[0].message.model_dump()  # content, role and refusal / annotations / audio / ... as null
    assert dumped["refusal"] is None and "annotations" in dumped and "function_call" in dumped
    follow_up = {"role": "user", "content": "And of Italy?"}
    as_dump = client.chat.completions.create(model=SERVED_MODEL, messages=[*CAPITAL, dumped, follow_up], max_tokens=1)
    as_text = {"role": "assistant", "content": reply.choices[0].message.content}
    by_hand = client.chat.completions.create(model=SERVED_MODEL, messages=[*CAPITAL, as_text, follow_up], max_tokens=1)
    assert as_dump.usage.prompt_tokens == by_hand.usage.prompt_tokens


def test_a_reply_field_with_content_ember_cannot_render_is_named(smollm2_server: ServeProcess) -> None:
    refused = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    response = httpx.post(f"{smollm2_server.base_url}/v1/chat/completions",
                          json={"model": SERVED_MODEL, "messages": [*CAPITAL, refused], "max_tokens": 1})  # fmt: skip
    error = assert_openai_error(response, 400)
    assert error["param"] == "messages.1.refusal"


def test_echo_with_zero_max_tokens_scores_the_prompt_alone(client: OpenAI) -> None:
    prompt = "The sky is blue"
    scored = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    extended = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0)
    choice = scored.choices[0]
    assert choice.text == prompt
    assert choice.finish_reason == "length"
    assert scored.usage.completion_tokens == 0
    num_prompt_tokens = scored.usage.prompt_tokens
    assert len(choice.logprobs.tokens) == num_prompt_tokens
    expected = extended.choices[0].logprobs.token_logprobs[:num_prompt_tokens]
    assert choice.logprobs.token_logprobs[0] is None and expected[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected[1:])
    streamed = list(client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=0, echo=True, stream=True))
    assert "".join(chunk.choices[0].text for chunk in streamed) == prompt


def test_zero_max_tokens_without_echo_is_refused(smollm2_server: ServeProcess) -> None:
    response = httpx.post(f"{smollm2_server.base_url}/v1/completions",
                          json={"model": SERVED_MODEL, "prompt": "Hi", "max_tokens": 0})  # fmt: skip
    assert assert_openai_error(response, 400)["param"] == "max_tokens"
