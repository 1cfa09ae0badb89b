"""The gateway is an engine-free process: importing it or running `ember gateway` loads no torch."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.gateway.backends import FakeBackend
from tests.gateway.harness import GatewayProcess, write_config
from tests.server.harness import REPO_ROOT

ENGINE_MODULES = "[m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'ember.engine', 'ember.models', 'ember.layers'))]"


def test_importing_the_gateway_and_its_cli_loads_neither_torch_nor_the_engine():
    code = (
        "import sys, ember.gateway.app, ember.gateway.cli, ember.gateway.redis_store, ember.gateway.sqlite_store\n"
        "from ember.cli.main import main\n"
        "assert main(['gateway', '--hash-key', 'k']) == 0\n"
        f"print({ENGINE_MODULES})"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_ember_gateway_command_serves_from_a_yaml_config(tmp_path):
    with FakeBackend("a") as backend:
        config = {
            "backends": [{"name": "a", "url": backend.url}],
            "models": [{"name": "m", "backends": ["a"]}],
            "store": {"path": str(tmp_path / "gw.sqlite3")},
        }
        with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gateway:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            response = httpx.post(gateway.base_url + "/v1/chat/completions", json=body, timeout=10)
        log = gateway.log_text()
    assert response.json()["choices"][0]["message"]["content"] == "a says: hi"
    log_line = next(line for line in log.splitlines() if '"request_id"' in line)
    assert '"status": "ok"' in log_line and "hi" not in log_line.replace("request_id", "")


def test_a_bad_config_is_refused_with_the_field_named(tmp_path):
    path = write_config(tmp_path, {"backends": [{"name": "a", "url": "ftp://x"}], "models": []})
    result = subprocess.run(
        [sys.executable, "-m", "ember.cli.main", "gateway", "--config", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "backends.a.url: must start with http:// or https://" in result.stderr
