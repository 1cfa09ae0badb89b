"""Constrained outputs: a generation held to JSON, any object or a schema, token by token."""

from ember.engine.structured.json_format import JsonFormat
from ember.engine.structured.json_schema import SchemaError

__all__ = ["JsonFormat", "SchemaError"]
