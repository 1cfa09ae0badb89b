"""A report names the tree it measured: the commit when clean, the commit and the diff's hash when not."""

from __future__ import annotations

import subprocess

from ember.bench.machine import git_commit
from ember.bench.report import describe_tree


def git(folder, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True, text=True).stdout.strip()


def test_a_clean_tree_is_its_commit_and_a_dirty_one_adds_the_hash_of_its_diff(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = git(tmp_path, "rev-parse", "--short=12", "HEAD")
    assert git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    dirty = git_commit(tmp_path)
    assert dirty.startswith(f"{head}+dirty.") and len(dirty) == len(head) + len("+dirty.") + 12
    (tmp_path / "a.txt").write_text("three\n")
    assert git_commit(tmp_path) not in (dirty, head)  # another diff, another hash


def test_the_report_says_clean_or_names_the_diff():
    assert describe_tree("abc123") == "commit `abc123` (clean tree)"
    assert "uncommitted changes" in describe_tree("abc123+dirty.0123456789ab") and "`0123456789ab`" in describe_tree("abc123+dirty.0123456789ab")
