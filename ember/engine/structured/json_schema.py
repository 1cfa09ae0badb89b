"""A JSON Schema (the subset a recogniser can enforce token by token) compiled into a table of nodes.

Each node says what one JSON value may be: anything, an object with its properties in the schema's order, an
array of one item kind (after a `prefixItems` tuple; `uniqueItems` over enum values, plain strings or unbounded
numbers), a string (`minLength` / `maxLength`, `pattern` or a `format` of `regex_nfa.FORMATS`, or both), a number
or an integer (`minimum`, `maximum`, their exclusive forms, `multipleOf`), a boolean, null, one of a fixed set of
literal values (`enum` / `const`), or any of several nodes (`anyOf`, `oneOf`, a list of types). `$ref` to
`#/$defs/...` or `#/definitions/...` may recurse. A keyword that would constrain the value in a way the recogniser
does not enforce (`uniqueItems` over other items, an unknown `format`, `if` / `then`, ...) is refused with its
name, never silently ignored: an output the caller was promised conforms would not. Keywords that only permit
(additionalProperties beside named properties) or describe (titles, `discriminator`, formats that name no syntax
such as `binary`) are read as such.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ember.engine.structured.errors import SchemaError
from ember.engine.structured.json_bounds import Bound
from ember.engine.structured.regex_nfa import Nfa, compile_regex, format_regex

# Keywords that describe without constraining. `discriminator` (OpenAPI, pydantic's tagged unions) names the property
# that tells a oneOf's alternatives apart; the alternatives themselves hold that property to its value.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions", "strict", "discriminator"})  # fmt: skip
# Formats that name what a string is for, not a syntax (OpenAPI, pydantic's bytes, secrets and paths): any string.
PLAIN_STRING_FORMATS = frozenset({"binary", "password", "path"})
# OpenAPI's number formats: the integer ones bound the value, the float ones say nothing JSON can check.
INTEGER_FORMATS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
NUMBER_FORMATS = frozenset({"float", "double", *INTEGER_FORMATS})
TYPE_KEYWORDS = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "format", "multipleOf"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "format", "multipleOf"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
COMBINATORS = frozenset({"anyOf", "oneOf", "allOf", "enum", "const", "$ref", "type"})
MAX_SCHEMA_NODES = 4096


@dataclass(frozen=True)
class Property:
    """One object property: its key as JSON text (with quotes), its value's node, whether it must appear."""

    key_json: bytes
    node: int
    required: bool


@dataclass
class Node:
    """What one JSON value may be; `kind` picks which of the other fields mean something."""

    kind: str  # any, object, any_object, array, string, number, integer, boolean, null, literals, any_of, text, regex
    properties: tuple[Property, ...] = ()
    items: int = 0  # array: its items' node; any_object: its values' node
    prefix_items: tuple[int, ...] = ()  # array: the first items' own nodes (a tuple), `items` after them
    min_items: int = 0
    max_items: int | None = None
    unique: bool = False  # array: no two items equal (items of fixed values, plain strings or unbounded numbers)
    literals: tuple[bytes, ...] = ()  # JSON texts (`literals`), or raw texts (`text`: a list of choices)
    alternatives: tuple[int, ...] = ()
    min_length: int = 0  # string, in characters
    max_length: int | None = None
    lower: Bound | None = None  # number, integer
    upper: Bound | None = None
    multiple_of: Fraction | None = None  # number, integer: a positive decimal step
    pattern: Nfa | None = None  # string (its characters, unescaped), regex (raw text)
    # A pattern string whose lengths bound it beyond what the pattern does: per pattern state, the remaining
    # lengths that reach a match (Nfa.remaining_lengths, capped at max_length + 1, or at min_length).
    lengths: tuple[int, ...] | None = None

    def length_window(self, count: int) -> int:
        """The remaining lengths (as `lengths` bits) that keep a string of `count` characters within its bounds."""
        low = max(0, self.min_length - count)
        high = self.min_length if self.max_length is None else self.max_length - count
        return 0 if high < low else ((1 << (high + 1)) - 1) >> low << low

    def length_fits(self, count: int) -> bool:
        """Whether a pattern string of `count` characters may end (always, where its lengths are not counted)."""
        return self.lengths is None or (count >= self.min_length and (self.max_length is None or count <= self.max_length))

    @property
    def is_bounded(self) -> bool:
        """Whether its strings or numbers are checked as they are written (so their frames carry the node)."""
        return (self.min_length > 0 or self.max_length is not None or self.lower is not None or self.upper is not None
                or self.pattern is not None or self.multiple_of is not None)


@dataclass
class CompiledSchema:
    """The node table; node 0 is the whole output's value, node 1 is "any JSON value"."""

    nodes: list[Node] = field(default_factory=list)


ROOT, ANY = 0, 1


def compile_schema(schema: dict | bool | None) -> CompiledSchema:
    """Nodes for `schema`; None means "any JSON object" (OpenAI's `json_object` response format)."""
    compiler = _Compiler(schema if isinstance(schema, dict) else {})
    root = compiler.new_node()
    any_node = compiler.new_node()
    compiler.compiled.nodes[any_node] = Node("any")
    if schema is None:
        compiler.compiled.nodes[root] = Node("any_object", items=ANY)
    else:
        compiler.compiled.nodes[root] = compiler.node_for(schema, "schema")
    return compiler.compiled


def literal_json(value: Any) -> bytes:
    """The one spelling of a literal the recogniser accepts: compact JSON, UTF-8, keys in given order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class _Compiler:
    def __init__(self, document: dict) -> None:
        self.document = document
        self.compiled = CompiledSchema()
        self.refs: dict[str, int] = {}

    def new_node(self) -> int:
        if len(self.compiled.nodes) >= MAX_SCHEMA_NODES:
            raise SchemaError(f"the JSON schema needs more than {MAX_SCHEMA_NODES} nodes; simplify it")
        self.compiled.nodes.append(Node("any"))
        return len(self.compiled.nodes) - 1

    def add(self, schema: Any, where: str) -> int:
        """The node id of `schema` (a `$ref` already compiled, or in compilation, keeps its id)."""
        if isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
            return self._ref(schema["$ref"], where)
        node_id = self.new_node()
        self.compiled.nodes[node_id] = self.node_for(schema, where)
        return node_id

    def node_for(self, schema: Any, where: str) -> Node:
        if schema is True:
            return Node("any")
        if not isinstance(schema, dict):
            raise SchemaError(f"{where} must be a JSON schema object (or true), not {schema!r}")
        _refuse_unknown(schema, where)
        if "$ref" in schema:
            return self._only(schema, "$ref", where, Node("any_of", alternatives=(self._ref(schema["$ref"], where),)))
        if "const" in schema or "enum" in schema:
            return self._literals(schema, where)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return self._only(schema, keyword, where, self._any_of(schema[keyword], f"{where}.{keyword}"))
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise SchemaError(f"{where}.allOf: only a single-schema allOf is supported; merge the schemas into one")
            return self._only(schema, "allOf", where, self.node_for(parts[0], f"{where}.allOf[0]"))
        return self._typed(schema, where)

    def _only(self, schema: dict, keyword: str, where: str, node: Node) -> Node:
        """`node`, after checking `keyword` is the schema's only constraint (combined keywords are not merged)."""
        others = set(schema) - ANNOTATIONS - {keyword}
        if others:
            raise SchemaError(f"{where}: {keyword!r} combined with {sorted(others)} is not supported; "
                              f"use {keyword!r} alone or move the other keywords inside it")  # fmt: skip
        return node

    def _literals(self, schema: dict, where: str) -> Node:
        """`const` or `enum`: the values of the schema's `type` (if given) among them; a `type` only filters."""
        keyword = "const" if "const" in schema else "enum"
        values = [schema["const"]] if keyword == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}.enum must be a non-empty list of values")
        others = set(schema) - ANNOTATIONS - {keyword, "type"}
        if others:
            raise SchemaError(f"{where}: {keyword!r} combined with {sorted(others)} is not supported; use {keyword!r} alone")
        kinds = schema.get("type")
        if kinds is not None:
            kinds = {kinds} if isinstance(kinds, str) else set(kinds)
            values = [value for value in values if _json_types(value) & kinds]
            if not values:
                raise SchemaError(f"{where}: no value of {keyword!r} is of type {schema['type']!r}")
        return Node("literals", literals=tuple(dict.fromkeys(literal_json(value) for value in values)))

    def _any_of(self, options: Any, where: str) -> Node:
        if not isinstance(options, list) or not options:
            raise SchemaError(f"{where} must be a non-empty list of schemas")
        return Node("any_of", alternatives=tuple(self.add(option, f"{where}[{i}]") for i, option in enumerate(options)))

    def _typed(self, schema: dict, where: str) -> Node:
        kind = schema.get("type")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind is None:
            return Node("any")
        if isinstance(kind, list):
            if not kind:
                raise SchemaError(f"{where}.type must not be an empty list")
            return Node("any_of", alternatives=tuple(self.add({**schema, "type": k}, f"{where}.type[{i}]") for i, k in enumerate(kind)))
        if kind not in TYPE_KEYWORDS:
            raise SchemaError(f"{where}.type {kind!r} is not a JSON type; use one of {sorted(TYPE_KEYWORDS)}")
        misplaced = set(schema) - ANNOTATIONS - {"type"} - TYPE_KEYWORDS[kind]
        if misplaced:
            raise SchemaError(f"{where}: {sorted(misplaced)} cannot constrain a value of type {kind!r}")
        if kind == "object":
            return self._object(schema, where)
        if kind == "array":
            return self._array(schema, where)
        if kind == "string":
            return self._string(schema, where)
        if kind in ("number", "integer"):
            return self._number(kind, schema, where)
        return Node(kind)

    def _string(self, schema: dict, where: str) -> Node:
        min_length, max_length = schema.get("minLength", 0), schema.get("maxLength")
        if not _is_count(min_length) or (max_length is not None and (not _is_count(max_length) or max_length < min_length)):
            raise SchemaError(f"{where}: minLength / maxLength must be integers with 0 <= minLength <= maxLength")
        if schema.get("format") in PLAIN_STRING_FORMATS:
            schema = {key: value for key, value in schema.items() if key != "format"}
        if "pattern" in schema or "format" in schema:
            return self._pattern_string(schema, min_length, max_length, where)
        return Node("string", min_length=min_length, max_length=max_length)

    def _pattern_string(self, schema: dict, min_length: int, max_length: int | None, where: str) -> Node:
        """A string matching `pattern` (anywhere, unless anchored) or a `format` (whole), within the lengths given."""
        if "pattern" in schema and "format" in schema:
            raise SchemaError(f"{where}: 'pattern' and 'format' together are not supported; keep one")
        try:
            nfa = compile_regex(format_regex(schema["format"])) if "format" in schema else compile_regex(schema["pattern"], search=True)
        except SchemaError as error:
            raise SchemaError(f"{where}.{'format' if 'format' in schema else 'pattern'}: {error}") from error
        if min_length == 0 and max_length is None:
            return Node("string", pattern=nfa)
        counted = Node("string", pattern=nfa, min_length=min_length, max_length=max_length,
                       lengths=nfa.remaining_lengths(min_length if max_length is None else max_length + 1))
        possible = 0
        for state in nfa.initial():
            possible |= counted.lengths[state]
        within = counted.length_window(0)
        if not possible & within:
            raise SchemaError(f"{where}: no string matching the {'format' if 'format' in schema else 'pattern'} has a length "
                              f"from {min_length} to {max_length if max_length is not None else 'any'}")  # fmt: skip
        # the pattern's own lengths keep within the bounds: nothing to count
        return Node("string", pattern=nfa) if not possible & ~within else counted

    def _number(self, kind: str, schema: dict, where: str) -> Node:
        def bound(inclusive: str, exclusive: str) -> Bound | None:
            given = [(schema[name], name == exclusive) for name in (inclusive, exclusive) if name in schema]
            if len(given) > 1:
                raise SchemaError(f"{where}: give one of {inclusive} and {exclusive}")
            if not given:
                return None
            value, is_exclusive = given[0]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise SchemaError(f"{where}.{exclusive if is_exclusive else inclusive} must be a finite number")
            return Bound(Fraction(repr(value)), is_exclusive)

        lower, upper = bound("minimum", "exclusiveMinimum"), bound("maximum", "exclusiveMaximum")
        text_format = schema.get("format")
        if text_format is not None and (text_format not in NUMBER_FORMATS or (text_format in INTEGER_FORMATS) != (kind == "integer")):
            raise SchemaError(f"{where}: format {text_format!r} is not enforced on a {kind}; use int32 / int64 on integers, "
                              "float / double on numbers, or remove it")  # fmt: skip
        if text_format in INTEGER_FORMATS:
            least, most = INTEGER_FORMATS[text_format]
            lower = _tighter(lower, Bound(Fraction(least), False), max)
            upper = _tighter(upper, Bound(Fraction(most), False), min)
        if lower is not None and upper is not None and lower.value > upper.value:
            raise SchemaError(f"{where}: the minimum is above the maximum")
        return Node(kind, lower=lower, upper=upper, multiple_of=_multiple_of(schema, lower, upper, where))

    def _object(self, schema: dict, where: str) -> Node:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError(f"{where}: 'properties' must be an object and 'required' a list of names")
        missing = [name for name in required if name not in properties]
        if missing:
            raise SchemaError(f"{where}: required {missing} are not among the properties; declare them in 'properties'")
        extra = schema.get("additionalProperties")
        if not properties:  # a map: any keys, each value of `additionalProperties` (a schema, or anything)
            if extra is False:
                return Node("literals", literals=(b"{}",))
            values = self.add(extra, f"{where}.additionalProperties") if isinstance(extra, dict) and extra else ANY
            return Node("any_object", items=values)
        # Beside named properties, additionalProperties (absent, true, or a schema) only permits more keys: outputs hold
        # the named ones, in order, which every form of it allows.
        return Node("object", properties=tuple(
            Property(literal_json(name), self.add(value, f"{where}.properties.{name}"), name in required)
            for name, value in properties.items()
        ))  # fmt: skip

    def _array(self, schema: dict, where: str) -> Node:
        min_items = schema.get("minItems", 0)
        max_items = schema.get("maxItems")
        if not isinstance(min_items, int) or min_items < 0 or (max_items is not None and (not isinstance(max_items, int) or max_items < min_items)):
            raise SchemaError(f"{where}: minItems / maxItems must be integers with 0 <= minItems <= maxItems")
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise SchemaError(f"{where}.prefixItems must be a list of schemas")
        prefix_items = tuple(self.add(item, f"{where}.prefixItems[{i}]") for i, item in enumerate(prefix))
        if schema.get("items", True) is False:  # nothing after the prefix
            max_items = len(prefix_items) if max_items is None else min(max_items, len(prefix_items))
            if max_items < min_items:
                raise SchemaError(f"{where}: minItems is above the {len(prefix_items)} items prefixItems allows")
            items = ANY
        else:
            items = self.add(schema["items"], f"{where}.items") if "items" in schema else ANY
        unique = schema.get("uniqueItems", False)
        if unique is not False:
            self._check_unique(unique, items, prefix_items, min_items, where)
        return Node("array", items=items, prefix_items=prefix_items, min_items=min_items, max_items=max_items,
                    unique=bool(unique))

    def _check_unique(self, unique: Any, items: int, prefix_items: tuple[int, ...], min_items: int, where: str) -> None:
        """uniqueItems is enforced where a repeated item can always be avoided: items of fixed values (enough of
        them for minItems), plain strings, numbers without bounds."""
        if unique is not True:
            raise SchemaError(f"{where}.uniqueItems must be true or false")
        node = self.compiled.nodes[items]
        plain = node.kind == "string" and not node.is_bounded or node.kind in ("number", "integer") and not node.is_bounded
        if prefix_items or not (plain or node.kind == "literals"):
            raise SchemaError(f"{where}: uniqueItems is enforced on arrays whose items are enum values, plain strings or "
                              "numbers without bounds (and no prefixItems); remove it or loosen the items")  # fmt: skip
        if node.kind == "literals" and len(node.literals) < min_items:
            raise SchemaError(f"{where}: minItems {min_items} unique items, but the items take only {len(node.literals)} values")

    def _ref(self, ref: Any, where: str) -> int:
        if ref in self.refs:
            return self.refs[ref]
        prefixes = ("#/$defs/", "#/definitions/")
        if not isinstance(ref, str) or not ref.startswith(prefixes):
            raise SchemaError(f"{where}.$ref {ref!r}: only local references to '#/$defs/NAME' or '#/definitions/NAME' are supported")
        section, name = ref[2:].split("/", 1)
        target = self.document.get(section, {}).get(name)
        if target is None:
            raise SchemaError(f"{where}.$ref {ref!r} names no definition in the schema's {section!r}")
        node_id = self.new_node()
        self.refs[ref] = node_id  # before compiling the target, so a recursive reference finds it
        self.compiled.nodes[node_id] = self.node_for(target, ref)
        return node_id


def _multiple_of(schema: dict, lower: Bound | None, upper: Bound | None, where: str) -> Fraction | None:
    """`multipleOf` as an exact step (a JSON number is a finite decimal); SchemaError when no multiple fits the range."""
    if "multipleOf" not in schema:
        return None
    value = schema["multipleOf"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise SchemaError(f"{where}.multipleOf must be a positive number")
    step = Fraction(repr(value))
    if lower is not None and upper is not None:
        low = math.ceil(lower.value / step) + (lower.exclusive and lower.value % step == 0)
        if low * step > upper.value or (upper.exclusive and low * step == upper.value):
            raise SchemaError(f"{where}: no multiple of {value} lies between the minimum and the maximum")
    return step


def _tighter(given: Bound | None, implied: Bound, pick) -> Bound:
    """The tighter of a schema's bound and the one its format implies (`pick`: max for lower bounds, min for upper)."""
    if given is None or given.value == implied.value:
        return implied if given is None else given
    return given if pick(given.value, implied.value) == given.value else implied


def _json_types(value: Any) -> set[str]:
    """The JSON Schema types a JSON value is of (an integral number is both an integer and a number)."""
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    kinds = {float: "number", str: "string", type(None): "null", list: "array", dict: "object"}
    return {kinds[type(value)]} if type(value) in kinds else set()


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _refuse_unknown(schema: dict, where: str) -> None:
    known = ANNOTATIONS | COMBINATORS | frozenset().union(*TYPE_KEYWORDS.values())
    unknown = sorted(set(schema) - known)
    if unknown:
        raise SchemaError(f"{where}: {unknown} {'is' if len(unknown) == 1 else 'are'} not enforced by ember's JSON "
                          "output constraint; remove them from the schema")  # fmt: skip
