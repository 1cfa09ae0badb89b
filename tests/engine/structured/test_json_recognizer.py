"""The byte-level JSON recogniser against Python's json module (the reference for JSON) and jsonschema.

Given JSON text the reference writes, the recogniser reads it to a finished value; given text it
accepts as finished, the reference parses it (and, with a schema, validates it).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.engine.structured import StructuredOutput
from ember.engine.structured.json_recognizer import MAX_WHITESPACE_RUN, JsonRecognizer
from ember.engine.structured.json_schema import compile_schema

scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": ["string", "null"]},
        "role": {"enum": ["admin", "user", 7]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "home": {"$ref": "#/$defs/place"},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
    "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}, "lat": {"type": "number"}}, "required": ["city"]}},
}


def finishes(schema: dict | None, text: str) -> bool:
    recognizer = JsonRecognizer(compile_schema(schema))
    return recognizer.may_end(recognizer.read(recognizer.initial, text.encode()))


def readable_prefix(schema: dict | None, text: str) -> bool:
    recognizer = JsonRecognizer(compile_schema(schema))
    return bool(recognizer.read(recognizer.initial, text.encode()))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=6), values, max_size=5), st.sampled_from([None, 1]), st.booleans())
def test_every_object_the_reference_writes_is_read_to_the_end(document, indent, ensure_ascii):
    text = json.dumps(document, indent=indent, ensure_ascii=ensure_ascii)
    assert finishes(None, text), text
    assert all(readable_prefix(None, text[:cut]) for cut in range(0, len(text), 7))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=6), values, max_size=4), st.data())
def test_text_read_as_a_finished_value_parses_whatever_a_byte_was_changed_to(document, data):
    text = json.dumps(document)
    position = data.draw(st.integers(0, len(text) - 1))
    replacement = data.draw(st.sampled_from(list('{}[]":,0123456789.eE-+ tfnul\\ax')))
    mutated = text[:position] + replacement + text[position + 1 :]
    if finishes(None, mutated):
        assert isinstance(json.loads(mutated), dict)


@pytest.mark.parametrize("text", ["[1, 2]", '"a"', "3", "{} {}", '{"a": 01}', '{"a": 1,}', '{"a" 1}', "{'a': 1}", '{"a": tru}',
                                  '{"a": "line\nbreak"}', '{"a": "\\x"}', '{"a": 1.}', '{"a": -}', '{"a": 1e}', '{"a": NaN}'])  # fmt: skip
def test_a_json_object_constraint_refuses_what_is_not_one_object(text):
    assert not finishes(None, text)


def test_whitespace_is_where_pretty_printing_puts_it_one_line_break_and_a_bounded_run_at_a_time():
    assert finishes(None, "{" + " " * MAX_WHITESPACE_RUN + "}")
    assert finishes(None, '{\n  "a": [\n    1\n  ]\n}')
    assert not readable_prefix(None, "{" + " " * (MAX_WHITESPACE_RUN + 1))
    assert not readable_prefix(None, "{\n\n")
    assert not readable_prefix(None, '{"a" :')


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), values, max_size=4))
def test_compact_json_reads_what_the_reference_writes_without_blanks_and_refuses_a_blank_between_tokens(document):
    compact = JsonRecognizer(compile_schema(None), max_whitespace_run=0)
    text = json.dumps(document, separators=(",", ":"))
    assert compact.may_end(compact.read(compact.initial, text.encode()))
    for position in _structural_positions(text):
        spaced = text[: position + 1] + " " + text[position + 1 :]
        assert not compact.read(compact.initial, spaced.encode()), spaced
    assert not compact.read(compact.initial, b"\n")


def _structural_positions(text: str) -> list[int]:
    """Where JSON text has a bracket, comma or colon outside its strings (a blank may follow in pretty JSON)."""
    found, in_string, escaped = [], False, False
    for position, char in enumerate(text):
        if in_string:
            in_string, escaped = (escaped or char != '"'), (not escaped and char == "\\")
        elif char == '"':
            in_string = True
        elif char in ",:{}[]":
            found.append(position)
    return found[:-1]  # not after the closing brace: the value has ended, nothing may follow anyway


@pytest.mark.parametrize("instance", [
    {"name": "Ada", "age": 36, "role": "admin"},
    {"name": "Ada", "age": -1, "email": None, "role": 7, "tags": ["x"], "home": {"city": "London", "lat": 51.5}},
    {"name": "", "age": 0, "email": "a@b", "role": "user", "home": {"city": "Paris"}},
])  # fmt: skip
@pytest.mark.parametrize("indent", [None, 2])
def test_instances_of_the_schema_written_in_its_property_order_are_read(instance, indent):
    jsonschema.validate(instance, PERSON)
    assert finishes(PERSON, json.dumps(instance, indent=indent))


@pytest.mark.parametrize("text", [
    '{"age": 36, "role": "admin"}',  # a required property missing
    '{"name": "Ada", "age": 36.5, "role": "admin"}',  # a number where an integer is asked for
    '{"name": "Ada", "age": 36, "role": "root"}',  # not one of the enum's values
    '{"name": "Ada", "age": 36, "role": "admin", "shoe": 42}',  # a property the schema does not name
    '{"name": "Ada", "age": 36, "role": "admin", "tags": []}',  # fewer items than minItems
    '{"name": "Ada", "age": 36, "role": "admin", "tags": ["a", "b", "c"]}',  # more than maxItems
    '{"name": "Ada", "age": 36, "role": "admin", "home": {"lat": 1}}',  # the referenced schema's required city
    '{"name": 5, "age": 36, "role": "admin"}',
])  # fmt: skip
def test_text_breaking_the_schema_is_refused_as_jsonschema_refuses_it(text):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(text), PERSON)
    assert not finishes(PERSON, text)


def test_a_recursive_reference_nests_to_any_depth():
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["value"]}}}  # fmt: skip
    text = json.dumps({"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}, {"value": 4}]})
    assert finishes(tree, text)
    assert not finishes(tree, text.replace('"value": 3', '"value": "3"'))


def test_a_top_level_number_may_end_or_go_on():
    recognizer = JsonRecognizer(compile_schema({"type": "integer"}))
    states = recognizer.read(recognizer.initial, b"12")
    assert recognizer.may_end(states) and not recognizer.is_complete(states)
    assert recognizer.may_end(recognizer.read(states, b"3"))


def test_choices_are_read_as_raw_text_and_a_choice_that_others_extend_may_end_or_go_on():
    recognizer = JsonRecognizer(StructuredOutput(choice=("yes", "yes!", "no way")).compile())
    yes = recognizer.read(recognizer.initial, b"yes")
    assert recognizer.may_end(yes) and not recognizer.is_complete(yes)
    assert recognizer.is_complete(recognizer.read(yes, b"!"))
    assert recognizer.is_complete(recognizer.read(recognizer.initial, b"no way"))
    assert not recognizer.read(recognizer.initial, b" yes")
    assert not recognizer.read(recognizer.initial, b'"no')


BOUNDED = {"type": "object", "properties": {
    "code": {"type": "string", "minLength": 2, "maxLength": 4},
    "count": {"type": "integer", "minimum": -5, "exclusiveMaximum": 250},
    "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
}, "required": ["code", "count", "ratio"], "additionalProperties": False}  # fmt: skip


@pytest.mark.parametrize("code", ["ab", "abcd", "é\\u00e9", "日本語", 'a\\"b', "a", "abcde", "日本語です", ""])
def test_string_lengths_count_characters_as_jsonschema_does(code):
    text = json.dumps({"code": json.loads(f'"{code}"'), "count": 1, "ratio": 1}, ensure_ascii=False)
    assert finishes(BOUNDED, text) == jsonschema.Draft202012Validator(BOUNDED).is_valid(json.loads(text)), text


@settings(max_examples=300, deadline=None)
@given(st.integers(-40, 400), st.decimals(min_value=-1, max_value=3, places=3, allow_nan=False, allow_infinity=False))
def test_number_ranges_hold_as_jsonschema_holds_them_and_a_prefix_lives_while_it_can_still_land_inside(count, ratio):
    value = {"code": "xyz", "count": count, "ratio": float(ratio)}
    text = f'{{"code": "xyz", "count": {count}, "ratio": {ratio:f}}}'
    assert finishes(BOUNDED, text) == jsonschema.Draft202012Validator(BOUNDED).is_valid(value), text
    cut = text[: text.index('"ratio"')]  # up to the count's comma: still readable exactly when the count fits
    assert readable_prefix(BOUNDED, cut) == (-5 <= count < 250)


def test_a_bounded_number_is_refused_as_soon_as_no_digit_can_bring_it_inside():
    assert readable_prefix(BOUNDED, '{"code": "xy", "count": 24')  # 24, or 240-249
    assert not readable_prefix(BOUNDED, '{"code": "xy", "count": 250')  # 250 and every longer number are out
    assert not readable_prefix(BOUNDED, '{"code": "xy", "count": 00')
    assert readable_prefix(BOUNDED, '{"code": "xy", "count": 0,')
    assert not readable_prefix(BOUNDED, '{"code": "xy", "count": -6')
    assert not readable_prefix(BOUNDED, '{"code": "xy", "count": 1, "ratio": 1.6')
    assert not readable_prefix(BOUNDED, '{"code": "xy", "count": 1, "ratio": 1e')  # decimal notation only


PATTERNED = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}\\d{3}$"},
             "note": {"type": "string", "pattern": "ok"}, "day": {"type": "string", "format": "date"}},
             "required": ["id", "note", "day"], "additionalProperties": False}  # fmt: skip


@pytest.mark.parametrize("value", [
    {"id": "AB123", "note": "it is ok", "day": "2024-05-01"},
    {"id": "AB123", "note": "o\nk ok\"", "day": "2024-05-01"},  # escapes are read as the characters they stand for
    {"id": "AB1234", "note": "ok", "day": "2024-05-01"},
    {"id": "AB123", "note": "o k", "day": "2024-05-01"},
    {"id": "AB123", "note": "ok", "day": "2024-5-1"},
    {"id": "ÀB123", "note": "ok", "day": "2024-05-01"},
])  # fmt: skip
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_patterned_strings_hold_as_jsonschema_holds_them(value, ensure_ascii):
    import re

    text = json.dumps(value, ensure_ascii=ensure_ascii)
    conforms = jsonschema.Draft202012Validator(PATTERNED).is_valid(value) and bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", value["day"]))
    assert finishes(PATTERNED, text) == conforms, text


def test_a_regex_output_may_end_when_it_matches_and_is_finished_when_nothing_can_follow():
    recognizer = JsonRecognizer(StructuredOutput(regex=r"(yes|no)|\d{2,3}").compile())
    states = recognizer.read(recognizer.initial, b"12")
    assert recognizer.may_end(states) and not recognizer.is_complete(states)
    assert recognizer.is_complete(recognizer.read(states, b"3"))
    assert recognizer.is_complete(recognizer.read(recognizer.initial, b"yes"))
    assert not recognizer.read(recognizer.initial, b"ye ")
    utf8 = JsonRecognizer(StructuredOutput(regex="caf[eé]").compile())
    assert utf8.is_complete(utf8.read(utf8.initial, "café".encode()))
    assert not utf8.read(utf8.initial, b"caf\xc3\x28")  # not UTF-8


@pytest.mark.parametrize("items", [False, {"type": "boolean"}, None])
@pytest.mark.parametrize("value", [[1, "a"], [1, "a", True], [1, "a", True, False], [1], ["a", 1], [], [1, "a", 3]])
def test_a_tuple_of_prefix_items_holds_as_jsonschema_holds_it(items, value):
    schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 1,
              **({} if items is None else {"items": items})}  # fmt: skip
    assert finishes(schema, json.dumps(value)) == jsonschema.Draft202012Validator(schema).is_valid(value), (schema, value)


@pytest.mark.parametrize("value", [{}, {"a": 1, "b": 2}, {"a": 1, "b": "2"}, {"a": {"c": 1}}, {"x": -3}])
def test_a_map_holds_every_value_to_its_additional_properties_schema(value):
    schema = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
    assert finishes(schema, json.dumps(value)) == jsonschema.Draft202012Validator(schema).is_valid(value), value


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=10).filter(lambda data: not set(data) & set(b'"\\') and all(b >= 0x20 for b in data)))
def test_a_string_body_is_read_whole_exactly_when_the_reference_decodes_its_bytes_as_utf8(data):
    recognizer = JsonRecognizer(compile_schema({"type": "string"}))
    try:
        data.decode("utf-8")
        decodes = True
    except UnicodeDecodeError:
        decodes = False
    assert recognizer.may_end(recognizer.read(recognizer.initial, b'"' + data + b'"')) == decodes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "\\ud83d\\ude00", "\\ud83d", "\\ude00", "\\u00e9", "\u00e9", "\\n"]), max_size=4),
       st.integers(0, 3), st.integers(0, 3))
def test_a_counted_string_counts_code_points_a_surrogate_pair_of_escapes_is_one(pieces, low, extra):
    """Whatever the recogniser reads whole validates (jsonschema counts code points: a pair of \\u escapes is one); a
    string within the bounds is read unless it ends at maxLength on a pair (then its low half's backslash is refused)."""
    schema = {"type": "string", "minLength": low, "maxLength": low + extra}
    text = '"' + "".join(pieces) + '"'
    recognizer = JsonRecognizer(compile_schema(schema))
    read = recognizer.may_end(recognizer.read(recognizer.initial, text.encode()))
    valid = low <= len(json.loads(text)) <= low + extra
    assert not read or valid, text
    if valid and "\\ud83d\\ude00" not in text:
        assert read, text
    pair_read = recognizer.may_end(recognizer.read(recognizer.initial, b'"x\\ud83d\\ude00"'))
    assert pair_read == (low <= 2 < low + extra)  # x, then the pair: two code points, its low half needs room to start
