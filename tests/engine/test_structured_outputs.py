"""JSON-constrained generation end to end on a real tiny model (stories260K), checked with jsonschema.

Given a schema and a model that knows nothing of JSON, when sequences are sampled (forks, seeds,
speculation beside them, a KV pool small enough to preempt), then every finished output parses and
validates, an unfinished one is still a readable prefix, and unconstrained neighbours are unchanged.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from ember.engine.sampling_params import SamplingParams
from ember.engine.structured import StructuredOutput
from tests.engine.stories import run_to_completion, stories_llm

SURVEY = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "pick": {"enum": ["cat", "dog", None]},
        "score": {"type": "number", "minimum": 0, "exclusiveMaximum": 10},
        "flags": {"type": "array", "items": {"type": ["boolean", "null"]}, "maxItems": 3},
        "note": {"type": "string", "minLength": 3, "maxLength": 40},
    },
    "required": ["ok", "pick", "flags"],
    "additionalProperties": False,
}


def _constraint(schema: dict | None) -> StructuredOutput:
    return StructuredOutput(json_schema=schema) if schema is not None else StructuredOutput(json_object=True)


def _prompt(llm, text: str) -> list[int]:
    return llm.tokenizer.encode(text, add_special_tokens=True)


def _check(text: str, finish_reason: str, schema: dict | None, recognizer_prefix) -> None:
    if finish_reason == "stop":
        value = json.loads(text)
        jsonschema.validate(value, schema or {"type": "object"})
    else:
        assert recognizer_prefix(text), text


@pytest.mark.parametrize("schema", [SURVEY, None])
def test_sampled_outputs_are_json_that_validates(stories_dir, schema):
    llm = stories_llm(stories_dir, block_size=4, num_kv_blocks=256)  # 9 sequences of up to 100 blocks: preempted
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=400, structured_output=_constraint(schema))
    prompts = {str(i): (_prompt(llm, text), params) for i, text in enumerate(["Once upon a time", "The dog", "Lily said"])}
    results = run_to_completion(llm, prompts)
    grammar = llm.engine.structured_outputs.grammar(_constraint(schema))
    recognizer = grammar.recognizer

    def readable(text: str) -> bool:
        return bool(recognizer.read(recognizer.initial, text.encode()))

    finishes = []
    for result in results.values():
        for completion in result.outputs:
            _check(completion.text, completion.finish_reason, schema, readable)
            finishes.append(completion.finish_reason)
    if schema is not None:  # the bounded schema always ends; an open object may nest past max_tokens
        assert "stop" in finishes and llm.engine.stats().num_preemptions > 0
    assert llm.engine.kv.num_free_blocks == 256


def test_a_constrained_request_beside_speculation_leaves_its_neighbours_unchanged(stories_dir):
    plain = stories_llm(stories_dir, block_size=16, num_kv_blocks=64)
    spec = stories_llm(stories_dir, block_size=16, num_kv_blocks=64, speculative_method="ngram", num_speculative_tokens=3)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=60, structured_output=StructuredOutput(json_schema=SURVEY))
    prompt = _prompt(plain, "The cat sat on the mat. The cat sat on the")
    requests = {"free": (prompt, greedy), "json": (prompt, constrained)}
    expected = run_to_completion(plain, requests)
    got = run_to_completion(spec, requests)
    assert got["free"].outputs[0].token_ids == expected["free"].outputs[0].token_ids
    assert got["json"].outputs[0].token_ids == expected["json"].outputs[0].token_ids
    assert spec.engine.stats().spec_verifications_total > 0
    completion = got["json"].outputs[0]
    if completion.finish_reason == "stop":
        jsonschema.validate(json.loads(completion.text), SURVEY)


def test_a_choice_constraint_samples_only_the_listed_replies(stories_dir):
    llm = stories_llm(stories_dir, block_size=16, num_kv_blocks=64)
    choices = ("happy", "sad", "a little sleepy")
    params = SamplingParams(n=6, temperature=1.0, seed=2, max_tokens=20, structured_output=StructuredOutput(choice=choices))
    result = run_to_completion(llm, {"feel": (_prompt(llm, "Lily felt very"), params)})["feel"]
    assert {c.finish_reason for c in result.outputs} == {"stop"}
    assert all(c.text in choices for c in result.outputs)
    assert len({c.text for c in result.outputs}) > 1


def test_a_regex_constraint_and_formatted_strings_hold_whatever_the_model_samples(stories_dir):
    import re

    llm = stories_llm(stories_dir, block_size=16, num_kv_blocks=256)
    pattern = r"[A-Z][a-z]{1,8}( [a-z]{1,8}){2,4}\."
    params = SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=60, structured_output=StructuredOutput(regex=pattern))
    dated = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "tag": {"type": "string", "pattern": "^[a-z]{2,6}$"}},
             "required": ["day", "tag"], "additionalProperties": False}  # fmt: skip
    schema_params = SamplingParams(n=3, temperature=1.0, seed=6, max_tokens=120, structured_output=StructuredOutput(json_schema=dated))
    prompt = _prompt(llm, "Once upon a time")
    results = run_to_completion(llm, {"regex": (prompt, params), "dated": (prompt, schema_params)})
    for completion in results["regex"].outputs:
        assert completion.finish_reason == "stop" and re.fullmatch(pattern, completion.text), completion.text
    for completion in results["dated"].outputs:
        assert completion.finish_reason == "stop", completion.text
        value = json.loads(completion.text)
        jsonschema.validate(value, dated)
        assert re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", value["day"])


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_constrained_requests_speculate_and_decode_what_they_decode_without(stories_dir, method):
    """Drafts are verified against the target's logits held to the constraint at each drafted position."""
    options = dict(speculative_method=method, num_speculative_tokens=4, adaptive=False)
    if method == "draft":
        options["draft_model"] = str(stories_dir / "stories260K.bin")
    plain = stories_llm(stories_dir, block_size=16, num_kv_blocks=128)
    spec = stories_llm(stories_dir, block_size=16, num_kv_blocks=128, **options)
    constraint = StructuredOutput(json_schema=SURVEY)
    greedy = SamplingParams(temperature=0, max_tokens=400, structured_output=constraint)
    sampled = SamplingParams(temperature=0.9, seed=4, max_tokens=400, structured_output=constraint)
    prompt = _prompt(plain, "The cat sat on the mat. The cat sat on the")
    expected = run_to_completion(plain, {"greedy": (prompt, greedy)})["greedy"].outputs[0]
    got = run_to_completion(spec, {"greedy": (prompt, greedy), "sampled": (prompt, sampled)})
    assert got["greedy"].outputs[0].token_ids == expected.token_ids
    assert spec.engine.stats().spec_accepted_tokens_total > 0
    for result in got.values():
        completion = result.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SURVEY)
