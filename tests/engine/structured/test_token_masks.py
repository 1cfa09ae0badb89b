"""Allowed-token masks from the trie walk against a token-by-token check of the whole vocabulary.

Given the SmolLM2 tokenizer and states reached by reading JSON prefixes, a token is in the mask
exactly when the recogniser can read all of its bytes from those states; end-of-sequence exactly
when the value may end; no other special token ever.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.engine.structured import StructuredOutput
from ember.engine.structured.structured_outputs import StructuredOutputs
from ember.tokenizers import load
from tests.engine.structured.test_json_recognizer import BOUNDED, PATTERNED, PERSON

PREFIXES = {
    None: ["", "{", '{"na', '{"name": "A', '{"a": [1, 2', '{"a": [1, {"b": "x\\', '{"a": tr', '{\n  "k": -0.5e', '{"x": {}'],
    "person": ["", '{"name"', '{"name": "Ada", ', '{"name": "Ada", "age": 3', '{"name": "Ada", "age": 36, "role": "a',
               '{"name": "Ada", "age": 36, "role": 7, "tags": [', '{"name": "Ada", "age": 36, "role": 7, "home": {"city": "Rome"}'],
    "bounded": ['{"code": "', '{"code": "a', '{"code": "abc', '{"code": "abcd', '{"code": "ab", "count": 2', '{"code": "ab", "count": -',
                '{"code": "ab", "count": 3, "ratio": 1.'],
    "patterned": ['{"id": "', '{"id": "AB1', '{"id": "AB123", "note": "', '{"id": "AB123", "note": "o\\', '{"id": "AB123", "note": "xok',
                  '{"id": "AB123", "note": "ok", "day": "2024-1'],
}  # fmt: skip
SCHEMAS = {"person": PERSON, "bounded": BOUNDED, "patterned": PATTERNED}


@pytest.fixture(scope="module")
def tokenizer(shared_dir: Path):
    return load(shared_dir / "tokenizers" / "smollm2")


@pytest.mark.parametrize(("schema_name", "prefix"), [(name, prefix) for name, prefixes in PREFIXES.items() for prefix in prefixes])
def test_the_mask_holds_exactly_the_tokens_the_recognizer_can_read(tokenizer, schema_name, prefix):
    outputs = StructuredOutputs(tokenizer, tokenizer.vocab_size + 3)  # a model may have more logits than tokens
    guide = outputs.guide(StructuredOutput(json_schema=SCHEMAS[schema_name]) if schema_name else StructuredOutput(json_object=True))
    grammar = guide.grammar
    states = grammar.recognizer.read(guide.states, prefix.encode())
    assert states, prefix
    logits = torch.zeros(tokenizer.vocab_size + 3)
    grammar.allowed(states).apply(logits)
    mask = logits > float("-inf")
    may_end = grammar.recognizer.may_end(states)
    for token_id in range(tokenizer.vocab_size + 3):
        if token_id in tokenizer.eos_ids:
            assert bool(mask[token_id]) == may_end, (prefix, token_id)
        elif token_id >= tokenizer.vocab_size or tokenizer.is_special(token_id):
            assert not mask[token_id], (prefix, token_id)
        else:
            assert bool(mask[token_id]) == bool(grammar.advance(states, token_id)), (prefix, tokenizer.token_bytes(token_id))
        if token_id < tokenizer.vocab_size:
            assert grammar.allows(states, token_id) == bool(mask[token_id]), (prefix, token_id)


def test_a_finished_value_finishes_the_guide_and_a_special_token_stops_it(tokenizer):
    guide = StructuredOutputs(tokenizer, tokenizer.vocab_size).guide(StructuredOutput(json_object=True))
    for token_id in tokenizer.encode('{"a": [true]}'):
        assert not guide.is_finished
        guide.advance(token_id)
    assert guide.is_finished
    stuck = StructuredOutputs(tokenizer, tokenizer.vocab_size).guide(StructuredOutput(json_object=True))
    stuck.advance(next(iter(tokenizer.eos_ids)))
    assert stuck.is_finished and not stuck.states


def test_holding_a_greedy_row_keeps_an_allowed_best_token_and_masks_otherwise_as_a_sampled_row_always_is(tokenizer):
    grammar = StructuredOutputs(tokenizer, tokenizer.vocab_size).grammar(StructuredOutput(json_object=True))
    states = grammar.recognizer.read(grammar.recognizer.initial, b'{"a": ')
    allowed, refused = tokenizer.encode("1")[0], tokenizer.encode("}")[0]
    for best, is_greedy, untouched in ((allowed, True, True), (refused, True, False), (allowed, False, False)):
        logits = torch.zeros(tokenizer.vocab_size)
        logits[best] = 5.0
        grammar.hold(logits, states, is_greedy)
        assert bool((logits > float("-inf")).all()) == untouched
        masked = torch.zeros(tokenizer.vocab_size)
        grammar.allowed(states).apply(masked)
        assert int(logits.argmax()) == int((masked + torch.where(torch.arange(tokenizer.vocab_size) == best, 5.0, 0.0)).argmax())


WALKED = [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[A-Z][a-z]{1,5}$", "minLength": 3},
                                      "b": {"type": "integer", "minimum": -5, "maximum": 50, "multipleOf": 5}}, "required": ["a", "b"]},
    {"type": "object", "properties": {"ip": {"type": "string", "format": "ipv6"}, "e": {"type": "string", "format": "email", "maxLength": 12}},
     "required": ["ip", "e"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
                                      "c": {"type": "array", "items": {"enum": ["x", "y"]}, "uniqueItems": True}}, "required": ["tags", "c"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 3},
                                      "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "multipleOf": 0.125}}, "required": ["s", "x"]},
]  # fmt: skip


@pytest.mark.parametrize("schema", WALKED)
def test_random_walks_over_the_vocabulary_never_reach_a_state_no_token_continues(tokenizer, schema):
    """Tokens drawn uniformly from each mask (odd multi-byte pieces and escapes included): the guide always offers a
    token that keeps the value possible until the value may end, and what it finishes is valid JSON of the schema."""
    import json
    import random

    import jsonschema

    outputs, rng, eos = StructuredOutputs(tokenizer, tokenizer.vocab_size), random.Random(7), set(tokenizer.eos_ids)
    for _ in range(6):
        guide, text = outputs.guide(StructuredOutput(json_schema=schema)), b""
        while not guide.is_finished and len(text) < 400:
            logits = torch.zeros(tokenizer.vocab_size)
            guide.hold(logits, is_greedy=False)
            offered = [t for t in torch.nonzero(torch.isfinite(logits)).flatten().tolist() if t not in eos]
            may_end = guide.grammar.recognizer.may_end(guide.states)
            assert offered or may_end, text
            if may_end and (not offered or rng.random() < 0.2):
                break
            token = rng.choice(offered)
            text += tokenizer.token_bytes(token)
            guide.advance(token)
        if guide.grammar.recognizer.may_end(guide.states):
            jsonschema.validate(json.loads(text.decode("utf-8")), schema)
