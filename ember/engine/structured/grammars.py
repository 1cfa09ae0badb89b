"""Context-free grammars as requests give them, and which backend enforces a constraint.

A grammar is GBNF / EBNF (llama.cpp's and xgrammar's `root ::= ...`) or Lark (`start: ...`, llguidance's and
vLLM's). ember's own engine enforces JSON, regular expressions and choices but has no context-free parser, so
grammars go to xgrammar or llguidance, both real dependencies (`pip install 'ember[structured]'`).
"""

from __future__ import annotations

import importlib.util
import re

from ember.engine.structured.errors import SchemaError

BACKENDS = ("auto", "ember", "xgrammar", "llguidance")
GRAMMAR_BACKENDS = ("llguidance", "xgrammar")  # auto's order for a grammar (llguidance measured the faster here)
MAX_GRAMMAR_CHARACTERS = 200_000
_LIBRARY_NOISE = re.compile(r"^\[[^\]]*\] \S+:\d+: ")  # xgrammar's "[time] file.cc:106: " before its message


def grammar_dialect(text: str) -> str:
    """"ebnf" for GBNF / EBNF rules (`name ::= ...`), else "lark" (`start: ...`)."""
    return "ebnf" if "::=" in text and not re.search(r"(?m)^\s*(%llguidance\b|start\s*:)", text) else "lark"


def is_installed(backend: str) -> bool:
    """Whether the backend's library can be imported here (ember's own engine always can)."""
    return backend == "ember" or importlib.util.find_spec(backend) is not None


def check_grammar(text: str) -> None:
    """SchemaError naming the fault when `text` is not a grammar the backends' parser reads (llguidance's, which
    reads both dialects; xgrammar's where llguidance is not installed)."""
    if not isinstance(text, str) or not text.strip():
        raise SchemaError("a grammar is non-empty text: GBNF / EBNF (root ::= ...) or Lark (start: ...)")
    if len(text) > MAX_GRAMMAR_CHARACTERS:
        raise SchemaError(f"the grammar is {len(text)} characters; at most {MAX_GRAMMAR_CHARACTERS} are read")
    installed = [backend for backend in GRAMMAR_BACKENDS if is_installed(backend)]
    if not installed:
        raise SchemaError("grammars need xgrammar or llguidance, neither of which is installed: "
                          "pip install 'ember[structured]'")
    check_grammar_with(installed[0], text)


def check_grammar_with(backend: str, text: str) -> None:
    """SchemaError with the library's own message when `backend` cannot parse `text`."""
    if backend == "llguidance":
        import llguidance

        try:
            message = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("grammar", text))
        except ValueError as error:
            message = str(error)
    else:
        import xgrammar

        try:
            if grammar_dialect(text) == "ebnf":
                xgrammar.Grammar.from_ebnf(text)
            else:
                xgrammar.Grammar.from_lark(text)
            message = ""
        except (RuntimeError, ValueError) as error:
            message = str(error)
    if message:
        raise SchemaError(f"the grammar does not parse ({backend}): {_LIBRARY_NOISE.sub('', message.strip())}")
