"""The docs a newcomer reads: a short README whose links land, a README per package, a site that builds clean."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p for p in (REPO_ROOT / "ember").iterdir() if (p / "__init__.py").is_file())
# [text](target): relative targets only (not http:, mailto: or a bare #anchor).
RELATIVE_LINK = re.compile(r"\]\((?![a-z]+:|#)([^)#\s]+)(?:#[^)\s]*)?\)")


def test_the_readme_stays_under_150_lines():
    assert len((REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_every_package_has_a_readme_naming_what_it_must_not_import(package):
    text = (package / "README.md").read_text(encoding="utf-8")
    assert text.startswith(f"# ember.{package.name}\n")
    assert "Entry points" in text and "Must not" in text


@pytest.mark.parametrize(
    "readme", [REPO_ROOT / "README.md", *(p / "README.md" for p in PACKAGES)], ids=lambda p: str(p.relative_to(REPO_ROOT))
)
def test_links_in_the_readmes_land_on_files(readme):
    targets = RELATIVE_LINK.findall(readme.read_text(encoding="utf-8"))
    assert targets, f"{readme} links nowhere"
    missing = [t for t in targets if not (readme.parent / t).exists()]
    assert missing == []


def test_the_docs_site_builds_without_a_warning(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()
