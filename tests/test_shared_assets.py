"""Missing shared assets fail the suite, unless the user opts out with EMBER_SHARED_OPTIONAL=1."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.shared_assets import OPTIONAL_ENV, REPO_ROOT, SHARED_ENV

# A test that needs a shared file, run in a child pytest with the suite's fixtures loaded.
NEEDS_SHARED = """
def test_reads_the_chat_template(shared_dir):
    assert (shared_dir / "tokenizers/smollm2/chat_template.jinja").is_file()
"""


def run_pytest(tmp_path, **env: str) -> subprocess.CompletedProcess:
    test_file = tmp_path / "test_needs_shared.py"
    test_file.write_text(NEEDS_SHARED)
    environment = {key: value for key, value in os.environ.items() if key != OPTIONAL_ENV}
    environment.update(env, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # only the suite's fixtures: a fast start
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    command += ["--rootdir", str(tmp_path), str(test_file)]
    return subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)


def test_missing_shared_assets_fail_the_run_and_say_where_to_put_them(tmp_path):
    result = run_pytest(tmp_path, **{SHARED_ENV: str(tmp_path / "nowhere")})
    assert result.returncode != 0, result.stdout
    assert "1 error" in result.stdout
    assert "shared test asset missing" in result.stdout
    assert f"set {OPTIONAL_ENV}=1" in result.stdout


def test_opting_out_skips_with_the_same_reason(tmp_path):
    result = run_pytest(tmp_path, **{SHARED_ENV: str(tmp_path / "nowhere"), OPTIONAL_ENV: "1"})
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert "shared test asset missing" in result.stdout
