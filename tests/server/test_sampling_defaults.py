"""`--generation-config`: a model folder's recommended sampling settings fill the fields a request leaves out (vLLM's
default, `auto`), a request's own values win, `vllm` keeps OpenAI's, and a bad file is refused at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import OpenAI

from ember.engine.sampling_defaults import SamplingDefaults, sampling_defaults
from ember.server.cli import with_generation_config
from ember.server.config import ServerConfig
from ember.server.openai.engine_requests import chat_sampling_params
from ember.server.openai.protocol import ChatCompletionRequest
from tests.server.harness import ThreadedServer
from tests.server.real_engine import MODEL, RecordingEngine, tiny_app

QWEN_LIKE = {"bos_token_id": 1, "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
             "max_new_tokens": 9}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN_LIKE))
    return tmp_path


def test_a_folders_generation_config_fills_what_a_request_leaves_out(folder):
    defaults = sampling_defaults("auto", folder)
    assert defaults == SamplingDefaults(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, max_tokens=9)
    left_out = chat_sampling_params(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]), defaults)
    assert (left_out.temperature, left_out.top_p, left_out.top_k, left_out.repetition_penalty, left_out.max_tokens) == (0.7, 0.8, 20, 1.05, 9)
    given = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.0, top_k=0, max_tokens=3)
    own = chat_sampling_params(given, defaults)
    assert (own.temperature, own.top_k, own.max_tokens, own.top_p) == (0.0, 0, 3, 0.8)
    assert sampling_defaults("vllm", folder) == SamplingDefaults()
    assert sampling_defaults("auto", folder / "model.gguf") == SamplingDefaults()  # a file carries none
    assert sampling_defaults(str(folder), None) == sampling_defaults("auto", folder)


def test_the_served_api_answers_with_the_models_defaults(folder, engine: RecordingEngine):
    defaults = with_generation_config(ServerConfig(), "auto", str(folder)).sampling_defaults
    with ThreadedServer(tiny_app(engine, sampling_defaults=defaults)) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], extra_body={
            "request_id": "defaults", "ignore_eos": True})  # fmt: skip
        assert chat.usage.completion_tokens == 9 and chat.choices[0].finish_reason == "length"
        params = engine.only("chatcmpl-defaults").params
        assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.7, 0.8, 20, 1.05)
        response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
        assert (response.temperature, response.top_p) == (0.7, 0.8)


@pytest.mark.parametrize(("content", "message"), [({"temperature": "hot"}, "must be a number"),
                                                  ({"top_p": 1.5}, "top_p"), ("{not json", "cannot read")])
def test_a_bad_generation_config_is_refused_at_start(tmp_path, content, message):
    path = tmp_path / "generation_config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError, match=message):
        sampling_defaults("auto", tmp_path)
    with pytest.raises(SystemExit, match=message):
        with_generation_config(ServerConfig(), "auto", str(tmp_path))
    with pytest.raises(ValueError, match="no generation_config.json there"):
        sampling_defaults(str(tmp_path / "elsewhere"), None)
