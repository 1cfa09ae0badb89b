"""What a request asks of its output's shape: a JSON object, a value conforming to a JSON schema, one
string out of a fixed list, text a regular expression matches, or text a context-free grammar derives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ember.engine.structured.grammars import check_grammar
from ember.engine.structured.json_schema import (
    ROOT,
    CompiledSchema,
    Node,
    SchemaError,
    compile_schema,
)
from ember.engine.structured.regex_nfa import compile_regex

MAX_CHOICES = 4096


@dataclass(frozen=True)
class StructuredOutput:
    """Hold a generation to one shape; set exactly one of the five.

    `json_object`: any JSON object (OpenAI's `response_format={"type": "json_object"}`).
    `json_schema`: a value conforming to the schema (OpenAI's `json_schema`; vLLM's `guided_json`).
    `choice`: exactly one of these strings, as written (vLLM's `guided_choice`).
    `regex`: text the regular expression matches whole (vLLM's `guided_regex`).
    `grammar`: text a context-free grammar derives: GBNF / EBNF (`root ::= ...`, llama.cpp's `grammar`) or Lark
    (`start: ...`), vLLM's `guided_grammar`; enforced by the xgrammar or llguidance backend, not ember's own.
    `compact_whitespace`: JSON without whitespace between its tokens (vLLM's `disable_any_whitespace`);
    else blanks are allowed where pretty-printed JSON has them.
    Checked on construction: a schema keyword ember cannot enforce, or a grammar that does not parse, raises
    SchemaError (a ValueError) naming it.
    """

    json_object: bool = False
    json_schema: dict[str, Any] | None = None
    choice: tuple[str, ...] | None = None
    regex: str | None = None
    grammar: str | None = None
    compact_whitespace: bool = False

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [self.json_object, self.json_schema is not None, self.choice is not None, self.regex is not None,
                 self.grammar is not None]
        if sum(given) != 1:
            raise SchemaError("a structured output sets exactly one of json_object, json_schema, choice, regex and grammar")
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise SchemaError(f"a JSON schema is a JSON object, not {type(self.json_schema).__name__}")
        if self.choice is not None:
            _check_choice(self.choice)
        if self.grammar is not None:
            check_grammar(self.grammar)  # ember's own engine reads no grammar: the backends' parser checks it
        else:
            self.compile()

    @property
    def key(self) -> str:
        """One spelling per distinct constraint (compiled constraints are shared by it)."""
        if self.choice is not None:
            return "choice " + json.dumps(self.choice)
        if self.regex is not None:
            return "regex " + self.regex
        if self.grammar is not None:
            return "grammar " + self.grammar
        shape = "object" if self.json_object else "schema " + json.dumps(self.json_schema, sort_keys=True)
        return "compact " + shape if self.compact_whitespace else shape

    def compile(self) -> CompiledSchema:
        """The constraint as ember's own engine enforces it; a grammar raises SchemaError (another backend reads it)."""
        if self.grammar is not None:
            raise SchemaError("ember's own structured-output engine does not read grammars (a context-free grammar needs "
                              "a parser it does not have): start the engine with --structured-outputs-backend "
                              "xgrammar, llguidance or auto")
        if self.choice is not None:
            compiled = compile_schema({})
            compiled.nodes[ROOT] = Node("text", literals=tuple(dict.fromkeys(c.encode() for c in self.choice)))
            return compiled
        if self.regex is not None:
            compiled = compile_schema({})
            compiled.nodes[ROOT] = Node("regex", pattern=compile_regex(self.regex))
            return compiled
        try:
            return compile_schema(None if self.json_object else self.json_schema)
        except RecursionError as error:
            raise SchemaError("the JSON schema nests too deeply to compile; flatten it or use $defs") from error


def _check_choice(choice: tuple[str, ...]) -> None:
    if not choice or len(choice) > MAX_CHOICES or not all(isinstance(c, str) and c for c in choice):
        raise SchemaError(f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
