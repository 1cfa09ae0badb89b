"""Schemas the recogniser cannot enforce are refused by name; annotations are not constraints."""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import re
from fractions import Fraction

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.engine.structured import SchemaError, StructuredOutput
from ember.engine.structured.json_recognizer import JsonRecognizer


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "string", "pattern": "(a)\\1"}, "back-references"),
    ({"type": "string", "pattern": "(?=a)a"}, "look-arounds"),
    ({"type": "string", "pattern": "a", "format": "date"}, "together"),
    ({"type": "string", "pattern": "^a{5}$", "maxLength": 3}, "no string matching"),
    ({"type": "number", "format": "int32"}, "int32"),
    ({"const": 1, "type": "string"}, "no value"),
    ({"type": "number", "multipleOf": 0}, "multipleOf"),
    ({"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 4}, "no multiple"),
    ({"type": "string", "format": "idn-email"}, "idn-email"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "items": {"type": "object"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "above the maximum"),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": 0}, "one of minimum and exclusiveMinimum"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "b"),
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


def test_a_pydantic_model_s_schema_compiles_and_its_own_json_is_read_whole():
    """Reference: pydantic writes both the schema and an instance's JSON; the recogniser must read the instance."""
    import enum
    import uuid

    from pydantic import BaseModel, Field

    from ember.engine.structured.json_recognizer import JsonRecognizer

    class Color(enum.Enum):
        RED = "red"
        BLUE = "blue"

    class Pet(BaseModel):
        name: str = Field(min_length=1, max_length=20)
        age: int = Field(ge=0, le=40)

    class Owner(BaseModel):
        id: uuid.UUID
        email: str = Field(pattern=r"^[a-z.]+@[a-z]+\.[a-z]{2,}$")
        born: datetime.date
        seen: datetime.datetime
        color: Color
        score: float = Field(gt=0, lt=100)
        pets: list[Pet]
        point: tuple[int, int]
        tags: dict[str, int]
        nickname: str | None = None

    owner = Owner(id=uuid.UUID(int=7), email="ada.l@math.org", born=datetime.date(1815, 12, 10),
                  seen=datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc), color=Color.BLUE, score=99.5,
                  pets=[Pet(name="Rex", age=3)], point=(1, -2), tags={"a": 1})  # fmt: skip
    recognizer = JsonRecognizer(StructuredOutput(json_schema=Owner.model_json_schema()).compile())
    text = owner.model_dump_json(indent=2).replace("+00:00", "Z")
    assert recognizer.may_end(recognizer.read(recognizer.initial, text.encode())), text
    assert not recognizer.read(recognizer.initial, text.replace('"age": 3', '"age": 41').encode())


def test_pydantic_schemas_with_tagged_unions_urls_durations_and_open_models_are_read_as_the_reference_validates():
    """Reference: pydantic validates what the recogniser reads whole (its own JSON), and the recogniser refuses a
    wrong tag, an int64 overflow, a URL past its maxLength."""
    from typing import Annotated, Literal

    from pydantic import BaseModel, ConfigDict, Field, HttpUrl

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = Field(json_schema_extra={"format": "int64"})

    class Dog(BaseModel):
        kind: Literal["dog"]
        good: bool

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        note: bytes

    class Home(BaseModel):
        pet: Annotated[Cat | Dog, Field(discriminator="kind")]
        site: HttpUrl
        walk: datetime.timedelta
        gateway: ipaddress.IPv6Address
        extra: Open

    recognizer = JsonRecognizer(StructuredOutput(json_schema=Home.model_json_schema()).compile())
    home = Home(pet=Cat(kind="cat", lives=9), site="https://example.com/a?b=1", walk=datetime.timedelta(hours=1, minutes=30),
                gateway="2001:db8::1", extra=Open(note=b"hi"))  # fmt: skip
    text = home.model_dump_json(indent=2)
    assert recognizer.may_end(recognizer.read(recognizer.initial, text.encode())), text
    Home.model_validate_json(text)
    for wrong in (text.replace('"cat"', '"cow"'), text.replace('"lives": 9', f'"lives": {2**63}'),
                  text.replace("https://example.com/a?b=1", "https://example.com/" + "a" * 2100)):  # fmt: skip
        assert not recognizer.may_end(recognizer.read(recognizer.initial, wrong.encode()))


@pytest.mark.parametrize(("pattern", "low", "high"), [(r"^[a-c]+$", 2, 5), (r"b", 3, None), (r"^(ab|c)*$", 0, 4), (r"^a[bc]{0,9}$", 4, 6)])
def test_a_pattern_with_lengths_reads_exactly_the_strings_the_reference_accepts_and_never_strands_a_prefix(pattern, low, high):
    schema = {"type": "string", "pattern": pattern, "minLength": low, **({} if high is None else {"maxLength": high})}
    recognizer = JsonRecognizer(StructuredOutput(json_schema=schema).compile())
    for length in range(0, 9):
        for letters in itertools.product("abc", repeat=length):
            text = "".join(letters)
            expected = re.search(pattern, text) is not None and low <= len(text) and (high is None or len(text) <= high)
            assert recognizer.may_end(recognizer.read(recognizer.initial, json.dumps(text).encode())) == expected, text
            # a prefix the recogniser keeps always has an ending it accepts (no dead end for a sampler to meet)
            states = recognizer.read(recognizer.initial, ('"' + text).encode())
            if states:
                assert any(_endings(recognizer, states, b'abc"', 10 - length))


def _endings(recognizer, states, alphabet: bytes, budget: int):
    """True for each way of finishing from `states` in at most `budget` bytes of `alphabet` (lazily)."""
    if recognizer.may_end(states):
        yield True
    if budget > 0:
        for byte in alphabet:
            following = recognizer.step(states, byte)
            if following:
                yield from _endings(recognizer, following, alphabet, budget - 1)


def test_a_character_being_read_is_refused_as_soon_as_nothing_could_complete_it_within_the_pattern_and_lengths():
    """A sampler must never reach a state no token continues: a partial UTF-8 character or escape the pattern (or the
    length) cannot take is refused at its first byte, not after it."""
    recognizer = JsonRecognizer(StructuredOutput(json_schema={"type": "string", "pattern": "^[a-zé]+$", "maxLength": 3}).compile())

    def readable(text: bytes) -> bool:
        return bool(recognizer.read(recognizer.initial, text))

    assert readable('"é'.encode()) and readable(b'"\\u00e9') and readable(b'"\\u0061')
    assert not readable('"€'.encode()[:2]) and not readable("\"😀".encode()[:2])  # their lead bytes already doom them
    assert not readable(b'"\\u00f') and not readable(b'"\\u2')  # no character of [a-zé] starts so
    assert readable(b'"abc') and not readable(b'"abc\\') and not readable('"abcé'.encode()[:5])  # a fourth character


@pytest.mark.parametrize("items", [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"enum": ["a", "b", 3]}])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_unique_items_are_read_exactly_when_the_reference_finds_no_two_equal(items, data):
    values = {"string": st.text(alphabet="ab\u00e9", max_size=2), "integer": st.integers(-3, 3),
              "number": st.integers(-3, 3) | st.sampled_from([0.5, 1.0, -0.0, 2.50])}.get(items.get("type"), st.sampled_from(["a", "b", 3]))  # fmt: skip
    schema = {"type": "array", "items": items, "uniqueItems": True}
    document = data.draw(st.lists(values, max_size=4))
    text = json.dumps(document, ensure_ascii=data.draw(st.booleans()))
    recognizer = JsonRecognizer(StructuredOutput(json_schema=schema).compile())
    expected = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    assert recognizer.may_end(recognizer.read(recognizer.initial, text.encode())) == expected, text


def test_unique_items_never_strand_a_prefix_taken_values_are_refused_where_they_start_or_end():
    def readable(schema, text):
        recognizer = JsonRecognizer(StructuredOutput(json_schema={"type": "array", "uniqueItems": True, **schema}).compile())
        return bool(recognizer.read(recognizer.initial, text.encode()))

    enum = {"items": {"enum": ["a", "b"]}}
    assert readable(enum, '["a", "b"]') and not readable(enum, '["a", "a') and not readable(enum, '["a", "b",')
    assert not readable({"items": {"type": "integer"}}, "[0, 0") and not readable({"items": {"type": "integer"}}, "[0, -0")
    assert readable({"items": {"type": "integer"}}, "[1, 1") and not readable({"items": {"type": "integer"}}, "[1, 1,")
    assert readable({"items": {"type": "string"}}, '["x", "x') and not readable({"items": {"type": "string"}}, '["a", "\\u0061"')
    with pytest.raises(SchemaError, match="only 2 values"):
        StructuredOutput(json_schema={"type": "array", "uniqueItems": True, "minItems": 3, **enum})
    with pytest.raises(SchemaError, match="uniqueItems"):
        StructuredOutput(json_schema={"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 1}})


MULTIPLES = [{"type": "integer", "multipleOf": 7}, {"type": "integer", "multipleOf": 3, "minimum": -10, "exclusiveMaximum": 12},
             {"type": "number", "multipleOf": 0.25, "maximum": 2}, {"type": "number", "multipleOf": 0.05, "exclusiveMinimum": -1, "maximum": 1},
             {"type": "integer", "multipleOf": 2.5}]  # fmt: skip


@pytest.mark.parametrize("schema", MULTIPLES)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_multiple_of_reads_a_number_exactly_when_the_reference_validates_it(schema, data):
    """Reference: jsonschema for the range, exact decimal division for the step (jsonschema divides floats, so it finds
    0.15 no multiple of 0.05; the spec's multipleOf is exact, as pydantic's tolerant check agrees). Integers are written
    without a fraction."""
    decimals = st.decimals(-3, 3, places=2, allow_nan=False, allow_infinity=False)
    text = str(data.draw(st.integers(-30, 30) if schema["type"] == "integer" else st.integers(-30, 30) | decimals))
    recognizer = JsonRecognizer(StructuredOutput(json_schema=schema).compile())
    in_range = jsonschema.Draft202012Validator({k: v for k, v in schema.items() if k != "multipleOf"}).is_valid(json.loads(text))
    expected = in_range and Fraction(text) % Fraction(repr(schema["multipleOf"])) == 0
    assert recognizer.may_end(recognizer.read(recognizer.initial, text.encode())) == expected, text


@pytest.mark.parametrize("schema", MULTIPLES)
def test_every_number_prefix_multiple_of_keeps_has_an_ending_it_accepts(schema):
    recognizer = JsonRecognizer(StructuredOutput(json_schema=schema).compile())
    for text in ["-", "0", "1", "2", "-1", "1.", "0.2", "1.7", "-0.9", "12", "-10", "11"]:
        states = recognizer.read(recognizer.initial, text.encode())
        if states:
            assert any(_endings(recognizer, states, b"0123456789.", 4)), text
