"""ember.server: the OpenAI-compatible HTTP server in front of one engine (any `EngineClient`).

`build_app(engine, ServerConfig)` makes the FastAPI app over an `EngineClient` (for `ember serve`, an
`EngineProcessClient` whose step loop runs in a process of its own); `run_server(engine_config,
server_config)` loads a model and serves it; `ember serve` (ember/server/cli.py) is the command-line
way to the same. The endpoints, fields, errors and metrics are in docs/http-api.md.

The three names load their modules on first use, so `ember serve --help` (which imports
ember.server.cli) builds its parser without loading torch or the app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ember.server.app import build_app
    from ember.server.config import ServerConfig
    from ember.server.serve import run_server

__all__ = ["ServerConfig", "build_app", "run_server"]

_EXPORTS = {"build_app": "ember.server.app", "ServerConfig": "ember.server.config", "run_server": "ember.server.serve"}


def __getattr__(name: str) -> object:
    """`from ember.server import build_app` (and the others) imports the defining module then (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ember.server' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
