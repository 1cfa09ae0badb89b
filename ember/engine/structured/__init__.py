"""Constrained outputs: a generation held to JSON (any object or a schema's) or to one of fixed strings."""

from ember.engine.structured.json_schema import SchemaError
from ember.engine.structured.structured_output import StructuredOutput

__all__ = ["SchemaError", "StructuredOutput"]
