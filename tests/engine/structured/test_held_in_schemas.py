"""50 held-in JSON schemas on SmolLM2 through each structured-output backend: given a chat prompt asking for the
schema's fields, when the reply is decoded greedily under the schema (ember's own engine, xgrammar, llguidance;
jump-forward on), then every reply ends on its own and is JSON that validates against its schema (jsonschema)."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from ember.engine.sampling_params import SamplingParams
from ember.engine.structured import StructuredOutput

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")

SUBJECTS = ("a bicycle", "a city", "a book", "a recipe", "a movie", "a planet", "a laptop", "a dog", "a song", "a river")
FIELDS = {
    "name": {"type": "string", "maxLength": 24},
    "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
    "price": {"type": "number", "minimum": 0},
    "available": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue", "black", "white"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    "owner": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["first", "age"], "additionalProperties": False},
    "note": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]},
    "sizes": {"type": "array", "items": {"enum": ["S", "M", "L"]}, "minItems": 1, "maxItems": 3},
}  # fmt: skip


def held_in_schemas() -> list[dict]:
    """50 schemas: each takes 2 to 4 of the fields (every 7th of their combinations, so the set never changes), all
    required."""
    combinations = [picked for size in (2, 3, 4) for picked in itertools.combinations(FIELDS, size)][::7][:50]
    return [{"type": "object", "properties": {name: FIELDS[name] for name in picked}, "required": list(picked),
             "additionalProperties": False} for picked in combinations]  # fmt: skip


@pytest.fixture(scope="module")
def prompts(smollm2_gguf):
    from ember.tokenizers import load
    from ember.tokenizers.chat_template import load_chat_template

    tokenizer = load(str(smollm2_gguf))
    template = load_chat_template(tokenizer)
    rendered = []
    for i, schema in enumerate(held_in_schemas()):
        question = f"Describe {SUBJECTS[i % len(SUBJECTS)]} as a JSON object with the fields {', '.join(schema['properties'])}."
        text = template.render([{"role": "user", "content": question}], add_generation_prompt=True)
        rendered.append(tokenizer.encode(text, add_special_tokens=False))
    return rendered


def test_the_held_in_schemas_are_fifty_distinct_ones():
    assert len({json.dumps(schema, sort_keys=True) for schema in held_in_schemas()}) == 50


@pytest.mark.timeout(1800)  # 50 schemas decoded at once; ember's engine builds each schema's masks in Python
@pytest.mark.parametrize("backend", ["ember", "xgrammar", "llguidance"])
def test_every_reply_is_valid_json_of_its_schema(smollm2_gguf, prompts, backend):
    from ember.llm import LLM

    llm = LLM(str(smollm2_gguf), structured_outputs_backend=backend, max_num_seqs=50)
    schemas = held_in_schemas()
    params = [SamplingParams(temperature=0, max_tokens=160, structured_output=StructuredOutput(json_schema=schema))
              for schema in schemas]  # fmt: skip
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    for schema, output in zip(schemas, outputs, strict=True):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", (backend, schema, completion.text)
        jsonschema.validate(json.loads(completion.text), schema)
