"""`ember --help` and `ember CMD --help` build their parsers without loading torch, the engine or the server app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ember.cli.main import COMMAND_MODULES

REPO_ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: what `ember ARGS` leaves in sys.modules after printing its help.
HELP_PROBE = """
import contextlib, io, json, sys
from ember.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:])
    except SystemExit as exit:
        code = exit.code
heavy = sorted(m for m in sys.modules if m == "torch" or m in ("ember.engine.llm_engine", "ember.server.app"))
print(json.dumps({"code": code, "help": out.getvalue(), "heavy": heavy}))
"""


def _help(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", HELP_PROBE, *args, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_ember_help_lists_every_command_and_loads_neither_torch_nor_the_engine_nor_the_app():
    shown = _help()
    assert shown["code"] == 0
    assert shown["heavy"] == []
    for command in COMMAND_MODULES:
        assert command in shown["help"]


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_a_subcommand_help_prints_its_usage_without_loading_torch(command):
    shown = _help(command)
    assert shown["code"] == 0
    assert shown["help"].startswith(f"usage: ember {command}")
    assert shown["heavy"] == []
