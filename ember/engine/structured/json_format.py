"""What a request asks of its output's shape: JSON, any object or one conforming to a schema."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ember.engine.structured.json_schema import CompiledSchema, SchemaError, compile_schema


@dataclass(frozen=True)
class JsonFormat:
    """Constrain a generation to one JSON value: any object (`schema` None, OpenAI's `json_object`) or a
    value conforming to `schema` (OpenAI's `json_schema`). The schema is checked on construction: a
    keyword ember cannot enforce raises ValueError naming it."""

    schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.schema is not None and not isinstance(self.schema, dict):
            raise SchemaError(f"a JSON schema is a JSON object, not {type(self.schema).__name__}")
        self.compile()

    @property
    def key(self) -> str:
        """One spelling per distinct constraint (compiled constraints are shared by it)."""
        return "object" if self.schema is None else json.dumps(self.schema, sort_keys=True)

    def compile(self) -> CompiledSchema:
        return compile_schema(self.schema)
