"""LoRA adapters over HTTP, on the real engine: a request picks an adapter by `model`, /v1/models lists each adapter
with its parent, and `ember serve --lora-modules` refuses an adapter it cannot serve by name before it starts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import BadRequestError, OpenAI

from ember.engine.async_engine import AsyncEngine
from ember.engine.config import CacheConfig, EngineConfig, add_engine_arguments
from ember.engine.lora_request import LoRAConfig
from ember.server.cli import add_server_arguments, lora_modules_from_args
from tests.model_factory import save_random_adapter, save_tiny_model
from tests.server.harness import ThreadedServer, assert_openai_error
from tests.server.real_engine import MODEL, RecordingEngine, tiny_app

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("served-adapters")
    return {name: str(save_random_adapter(tiny_model_dir, root / name, TARGETS, rank=8, seed=seed))
            for seed, name in enumerate(("sql", "poems"), start=1)}


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path, smollm2_tokenizer_dir: Path, adapters: dict[str, str]) -> Iterator[tuple[OpenAI, RecordingEngine]]:
    config = EngineConfig(model=str(tiny_model_dir), tokenizer=str(smollm2_tokenizer_dir), dtype="float32", max_model_len=256,
                          cache=CacheConfig(block_size=16), lora=LoRAConfig(max_loras=2, max_lora_rank=8))
    engine = RecordingEngine(AsyncEngine(config, show_progress=False))
    with ThreadedServer(tiny_app(engine, lora_modules=adapters)) as running:
        yield OpenAI(base_url=f"{running.base_url}/v1", api_key="unused", max_retries=0), engine
    engine.shutdown()


def test_models_lists_each_adapter_with_its_parent(client) -> None:
    openai, _ = client
    cards = {card.id: card.model_dump() for card in openai.models.list().data}
    assert set(cards) == {MODEL, "sql", "poems"}
    assert cards["sql"]["parent"] == MODEL and cards[MODEL]["parent"] is None
    assert openai.models.retrieve("poems").model_dump()["parent"] == MODEL


def test_a_request_picks_its_adapter_by_model(client, adapters: dict[str, str]) -> None:
    openai, engine = client
    answers = {}
    for model in (MODEL, "sql", "poems", "sql"):
        completion = openai.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
        answers.setdefault(model, []).append(completion.choices[0].text)
        asked = engine.requests[f"{completion.id}-0"].lora_request
        expected = None if model == MODEL else (model, adapters[model])
        assert (None if asked is None else (asked.lora_name, asked.lora_path)) == expected
    assert answers["sql"][0] == answers["sql"][1]  # the same adapter answers the same, after another ran
    assert len({answers[MODEL][0], answers["sql"][0], answers["poems"][0]}) == 3


def _serve_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    add_server_arguments(parser)
    return parser.parse_args(["--model", "unused", *flags])


def test_serve_flags_name_adapters_both_ways_and_refuse_what_cannot_be_served(adapters: dict[str, str], tmp_path: Path) -> None:
    as_json = json.dumps({"name": "poems", "path": adapters["poems"]})
    args = _serve_args("--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"sql={adapters['sql']}", as_json)
    assert lora_modules_from_args(args) == adapters
    assert EngineConfig.from_args(args).lora == LoRAConfig(max_loras=1, max_lora_rank=8)
    with pytest.raises(ValueError, match="needs --enable-lora"):
        lora_modules_from_args(_serve_args("--lora-modules", f"sql={adapters['sql']}"))
    with pytest.raises(ValueError, match="rank 8 is above --max-lora-rank 4"):
        lora_modules_from_args(_serve_args("--enable-lora", "--max-lora-rank", "4", "--lora-modules", f"sql={adapters['sql']}"))
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "use_dora": True}))
    with pytest.raises(ValueError, match="uses DoRA"):
        lora_modules_from_args(_serve_args("--enable-lora", "--lora-modules", f"d={dora}"))


def test_embeddings_naming_an_adapter_are_refused_naming_the_base_model(client) -> None:
    openai, _ = client
    with pytest.raises(BadRequestError, match=f"send model '{MODEL}'") as refused:
        openai.embeddings.create(model="sql", input="hello")
    assert refused.value.body["param"] == "model"


def test_an_adapter_of_another_model_is_a_400_naming_the_mismatch(tiny_model_dir: Path, smollm2_tokenizer_dir: Path,
                                                                 tmp_path: Path) -> None:
    other = save_tiny_model("llama", tmp_path / "other", hidden_size=32, intermediate_size=64)  # another width
    foreign = str(save_random_adapter(other, tmp_path / "foreign", TARGETS, rank=4))
    config = EngineConfig(model=str(tiny_model_dir), tokenizer=str(smollm2_tokenizer_dir), dtype="float32", max_model_len=256,
                          cache=CacheConfig(block_size=16), lora=LoRAConfig(max_loras=1, max_lora_rank=8))
    engine = AsyncEngine(config, show_progress=False)
    try:
        with ThreadedServer(tiny_app(engine, lora_modules={"foreign": foreign})) as running:
            response = httpx.post(f"{running.base_url}/v1/completions", json={"model": "foreign", "prompt": "a", "max_tokens": 2})
            error = assert_openai_error(response, 400)
            assert error["param"] == "model" and "another base model" in error["message"]
    finally:
        engine.shutdown()


def test_adapters_load_and_unload_at_run_time_only_where_allowed(client, adapters: dict[str, str], tmp_path: Path) -> None:
    openai, engine = client
    with ThreadedServer(tiny_app(engine, allow_runtime_lora_updating=True)) as running, \
            httpx.Client(base_url=running.base_url, timeout=30) as http:  # fmt: skip
        loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "poems-too", "lora_path": adapters["poems"]})
        assert loaded.status_code == 200 and "poems-too" in loaded.text
        assert http.get("/v1/models/poems-too").json()["parent"] == MODEL
        same = [http.post("/v1/completions", json={"model": model, "prompt": "Once", "max_tokens": 6, "temperature": 0}).json()
                ["choices"][0]["text"] for model in ("poems-too", MODEL)]  # fmt: skip
        assert same[0] == openai.completions.create(model="poems", prompt="Once", max_tokens=6, temperature=0).choices[0].text
        assert same[0] != same[1]
        assert assert_openai_error(http.post("/v1/load_lora_adapter", json={"lora_name": "poems-too", "lora_path": adapters["sql"]}),
                                   400)["param"] == "lora_name"
        assert assert_openai_error(http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)}),
                                   400)["param"] == "lora_path"
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "poems-too"}).status_code == 200
        gone = http.post("/v1/completions", json={"model": "poems-too", "prompt": "Once", "max_tokens": 2})
        assert assert_openai_error(gone, 404)["code"] == "model_not_found"
        assert assert_openai_error(http.post("/v1/unload_lora_adapter", json={"lora_name": "poems-too"}), 404)["param"] == "lora_name"
    with ThreadedServer(tiny_app(engine)) as running:
        assert httpx.post(f"{running.base_url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "b"}).status_code == 404
