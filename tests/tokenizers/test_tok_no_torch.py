"""ember.tokenizers must not import torch (it runs in processes that have no model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ember.tokenizers

MODULES = [
    "ember.tokenizers",
    "ember.tokenizers.cli",
    "ember.tokenizers.compare",
    "ember.tokenizers.training.bpe",
    "ember.tokenizers.training.unigram",
    "ember.bench.tokenizers",
]

# Loads the modules without running ember/__init__.py (which imports the engine), by
# registering a bare `ember` package first; torch must stay out of sys.modules.
PROBE = """
import sys, types
package = types.ModuleType("ember")
package.__path__ = [{package_dir!r}]
sys.modules["ember"] = package
import importlib
for name in {modules!r}:
    importlib.import_module(name)
from ember.tokenizers import load
print("torch" in sys.modules)
"""


def test_importing_and_using_the_package_never_imports_torch():
    package_dir = str(Path(ember.tokenizers.__file__).resolve().parent.parent)
    code = PROBE.format(package_dir=package_dir, modules=MODULES)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"
