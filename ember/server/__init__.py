"""ember.server: the OpenAI-compatible HTTP server in front of one AsyncEngine.

`build_app(engine, ServerConfig)` makes the app; `run_server(engine_config, server_config)`
loads a model and serves it; `ember serve` is the command-line way to the same.
"""

from ember.server.app import build_app
from ember.server.config import ServerConfig
from ember.server.serve import run_server

__all__ = ["ServerConfig", "build_app", "run_server"]
