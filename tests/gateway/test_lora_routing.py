"""The gateway routes to a LoRA adapter like to any model: a real `ember serve --enable-lora --lora-modules` behind it,
a gateway model naming an adapter (under its own name or another) answers as the adapter does when asked directly, and
the base model's name still reaches the base model."""

from __future__ import annotations

from pathlib import Path

import openai

from ember.gateway.app import build_app
from ember.gateway.config import config_from_dict
from tests.gateway.harness import ThreadedApp
from tests.model_factory import save_random_adapter
from tests.server.harness import tiny_server_process

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _completion(client: openai.OpenAI, model: str) -> str:
    return client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0).choices[0].text


def test_a_gateway_model_naming_an_adapter_answers_as_the_adapter_does(tiny_model_dir: Path, smollm2_tokenizer_dir: Path,
                                                                       tmp_path: Path) -> None:
    adapters = {name: save_random_adapter(tiny_model_dir, tmp_path / name, TARGETS, rank=8, seed=seed)
                for seed, name in enumerate(("sql", "poems"), start=1)}
    serve_args = ("--served-model-name", "tiny", "--max-model-len", "256", "--enable-lora", "--max-loras", "2",
                  "--max-lora-rank", "8", "--lora-modules", *(f"{name}={path}" for name, path in adapters.items()))
    with tiny_server_process(tiny_model_dir, smollm2_tokenizer_dir, tmp_path / "serve.log", *serve_args) as server:
        config = {
            "backends": [{"name": "ember", "url": f"{server.base_url}/v1", "continuous_usage": True}],
            "models": [{"name": "tiny", "backends": ["ember"]}, {"name": "sql", "backends": ["ember"]},
                       {"name": "verse", "backends": [{"backend": "ember", "model": "poems"}]}],
            "store": {"path": str(tmp_path / "gateway.sqlite3")},
        }
        with ThreadedApp(build_app(config_from_dict(config))) as gateway:
            direct = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
            routed = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
            backend_cards = {card.id: card.model_dump()["parent"] for card in direct.models.list().data}
            assert backend_cards == {"tiny": None, "sql": "tiny", "poems": "tiny"}
            assert {card.id for card in routed.models.list().data} == {"tiny", "sql", "verse"}
            expected = {model: _completion(direct, model) for model in ("tiny", "sql", "poems")}
            assert len(set(expected.values())) == 3  # each adapter answers otherwise than the base model
            through_gateway = {model: _completion(routed, model) for model in ("tiny", "sql", "verse")}
    assert through_gateway == {"tiny": expected["tiny"], "sql": expected["sql"], "verse": expected["poems"]}
