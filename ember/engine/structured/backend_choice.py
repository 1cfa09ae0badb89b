"""Which backend enforces one request's constraint on an engine configured with `--structured-outputs-backend`.

Apart from `grammars` (which `StructuredOutput` itself uses to check a grammar on construction), so the choice can
read the constraint without an import circle.
"""

from __future__ import annotations

from ember.engine.structured.errors import SchemaError
from ember.engine.structured.grammars import (
    BACKENDS,
    GRAMMAR_BACKENDS,
    check_grammar_with,
    is_installed,
)
from ember.engine.structured.structured_output import StructuredOutput


def choose_backend(constraint: StructuredOutput, configured: str) -> str:
    """The backend that enforces `constraint` on an engine started with `configured`: auto takes ember's own engine
    for JSON, regular expressions and choices (checked on construction) and the first installed grammar backend for a
    grammar. SchemaError names what to change where the configured backend cannot enforce it."""
    if configured not in BACKENDS:
        raise SchemaError(f"structured-outputs backend {configured!r} is unknown; choose one of {', '.join(BACKENDS)}")
    if configured == "auto":
        if constraint.grammar is None:
            return "ember"
        installed = [backend for backend in GRAMMAR_BACKENDS if is_installed(backend)]
        if not installed:
            raise SchemaError("grammars need xgrammar or llguidance: pip install 'ember[structured]'")
        return installed[0]
    if not is_installed(configured):
        raise SchemaError(f"the {configured} backend is not installed: pip install 'ember[structured]'")
    if configured == "ember" and constraint.grammar is not None:
        constraint.compile()  # raises, naming the backends that read grammars
    if configured == "xgrammar" and constraint.grammar is not None:
        check_grammar_with("xgrammar", constraint.grammar)
    return configured
