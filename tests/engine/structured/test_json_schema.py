"""Schemas the recogniser cannot enforce are refused by name; annotations are not constraints."""

from __future__ import annotations

import re

import pytest

from ember.engine.structured import SchemaError, StructuredOutput


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "string", "pattern": "(a)\\1"}, "back-references"),
    ({"type": "string", "pattern": "(?=a)a"}, "look-arounds"),
    ({"type": "string", "pattern": "a", "maxLength": 3}, "together"),
    ({"type": "number", "multipleOf": 2}, "multipleOf"),
    ({"type": "string", "format": "hostname"}, "hostname"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "above the maximum"),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": 0}, "one of minimum and exclusiveMinimum"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "b"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties"),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": False, "minItems": 2}, "prefixItems allows"),
    ({"type": "string", "items": {}}, "items"),
    ({"type": "date"}, "date"),
    ({"$ref": "https://example.com/schema"}, "$ref"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ({"allOf": [{"type": "string"}, {"type": "null"}]}, "allOf"),
    ({"anyOf": [{"type": "string"}], "type": "string"}, "anyOf"),
    ({"enum": []}, "enum"),
])  # fmt: skip
def test_a_keyword_ember_cannot_enforce_is_refused_by_name(schema, named):
    with pytest.raises(SchemaError, match=re.escape(named)):
        StructuredOutput(json_schema=schema)


def test_annotations_and_a_pydantic_style_schema_are_accepted():
    schema = {
        "title": "Person", "description": "someone", "type": "object",
        "properties": {"name": {"title": "Name", "type": "string"}, "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}], "default": None}},
        "required": ["name"], "$defs": {"Pet": {"title": "Pet", "type": "object", "properties": {"kind": {"enum": ["cat", "dog"], "type": "string"}}, "required": ["kind"]}},
    }  # fmt: skip
    assert StructuredOutput(json_schema=schema).compile().nodes


def test_a_schema_that_is_not_an_object_is_refused():
    with pytest.raises(SchemaError, match="JSON object"):
        StructuredOutput(json_schema=["type", "string"])


def test_a_structured_output_sets_exactly_one_shape():
    with pytest.raises(SchemaError, match="exactly one"):
        StructuredOutput()
    with pytest.raises(SchemaError, match="exactly one"):
        StructuredOutput(json_object=True, choice=("a",))
    with pytest.raises(SchemaError, match="non-empty strings"):
        StructuredOutput(choice=("a", ""))


def test_a_schema_referring_to_itself_through_anyof_alone_reads_nothing_and_does_not_loop():
    from ember.engine.structured.json_recognizer import JsonRecognizer

    looping = {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}}
    recognizer = JsonRecognizer(StructuredOutput(json_schema=looping).compile())
    assert recognizer.may_end(recognizer.read(recognizer.initial, b"null"))
    assert not recognizer.read(recognizer.initial, b"1")


def test_a_schema_nested_past_any_real_use_is_refused_not_crashed():
    deep: dict = {"type": "string"}
    for _ in range(2000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="nests too deeply"):
        StructuredOutput(json_schema=deep)
