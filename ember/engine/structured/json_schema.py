"""A JSON Schema (the subset a recogniser can enforce token by token) compiled into a table of nodes.

Each node says what one JSON value may be: anything, an object with its properties in the schema's
order, an array of one item kind (after a `prefixItems` tuple), a string (`minLength` / `maxLength`, or `pattern`, or a `format`
of `regex_nfa.FORMATS`), a number or an integer
(`minimum`, `maximum` and their exclusive forms), a boolean, null, one of a fixed set of literal values
(`enum` / `const`), or any of several nodes (`anyOf`, `oneOf`, a list of types). `$ref`
to `#/$defs/...` or `#/definitions/...` may recurse. A keyword that would constrain the value in a way
the recogniser does not enforce (`multipleOf`, `uniqueItems`, an unknown `format`, ...) is refused with its name, never
silently ignored: an output the caller was promised conforms would not.
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

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions", "strict"})  # fmt: skip
TYPE_KEYWORDS = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
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
    literals: tuple[bytes, ...] = ()  # JSON texts (`literals`), or raw texts (`text`: a list of choices)
    alternatives: tuple[int, ...] = ()
    min_length: int = 0  # string, in characters
    max_length: int | None = None
    lower: Bound | None = None  # number, integer
    upper: Bound | None = None
    pattern: Nfa | None = None  # string (its characters, unescaped), regex (raw text)

    @property
    def is_bounded(self) -> bool:
        """Whether its strings or numbers are checked as they are written (so their frames carry the node)."""
        return (self.min_length > 0 or self.max_length is not None or self.lower is not None or self.upper is not None
                or self.pattern is not None)


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
        if "const" in schema:
            return self._only(schema, "const", where, Node("literals", literals=(literal_json(schema["const"]),)))
        if "enum" in schema:
            return self._enum(schema, where)
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

    def _enum(self, schema: dict, where: str) -> Node:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}.enum must be a non-empty list of values")
        others = set(schema) - ANNOTATIONS - {"enum", "type"}  # a "type" beside an enum only repeats what it says
        if others:
            raise SchemaError(f"{where}: 'enum' combined with {sorted(others)} is not supported; use 'enum' alone")
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
        if "pattern" in schema or "format" in schema:
            return self._pattern_string(schema, where)
        min_length, max_length = schema.get("minLength", 0), schema.get("maxLength")
        if not _is_count(min_length) or (max_length is not None and (not _is_count(max_length) or max_length < min_length)):
            raise SchemaError(f"{where}: minLength / maxLength must be integers with 0 <= minLength <= maxLength")
        return Node("string", min_length=min_length, max_length=max_length)

    def _pattern_string(self, schema: dict, where: str) -> Node:
        """A string matching `pattern` (anywhere, unless anchored) or a `format` (whole)."""
        given = [name for name in ("pattern", "format", "minLength", "maxLength") if name in schema]
        if len(given) > 1:
            raise SchemaError(f"{where}: {given} together are not supported; keep one (a pattern can bound the length)")
        if "format" in schema:
            return Node("string", pattern=compile_regex(format_regex(schema["format"])))
        try:
            return Node("string", pattern=compile_regex(schema["pattern"], search=True))
        except SchemaError as error:
            raise SchemaError(f"{where}.pattern: {error}") from error

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
        if lower is not None and upper is not None and lower.value > upper.value:
            raise SchemaError(f"{where}: the minimum is above the maximum")
        return Node(kind, lower=lower, upper=upper)

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
        if extra is not None and extra is not False:
            raise SchemaError(f"{where}: additionalProperties beside named properties is not supported; "
                              "set it to false (outputs then hold the named properties, in order)")  # fmt: skip
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
        return Node("array", items=items, prefix_items=prefix_items, min_items=min_items, max_items=max_items)

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


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _refuse_unknown(schema: dict, where: str) -> None:
    known = ANNOTATIONS | COMBINATORS | frozenset().union(*TYPE_KEYWORDS.values())
    unknown = sorted(set(schema) - known)
    if unknown:
        raise SchemaError(f"{where}: {unknown} {'is' if len(unknown) == 1 else 'are'} not enforced by ember's JSON "
                          "output constraint; remove them from the schema")  # fmt: skip
