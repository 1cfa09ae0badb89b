"""Parallel text from Firefox language-pack .debs: Debian packages built here with dpkg-deb
(the real packs come from `apt-get download` and are never stored in the repository)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import zipfile

import pytest

from ember.tokenizers.cli import register
from ember.tokenizers.deb_text import fluent_messages, parallel_texts

FLUENT = {
    "en": "# comment\nhello = Hello { $name }, welcome\nbye = Goodbye\n    .title = Leave\nonly-en = x\n",
    "ko": "hello = { $name }님, 환영합니다\nbye = 안녕히 가세요\n    .title = 나가기\n",
}


def language_pack_deb(tmp_path, locale: str):
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    root = tmp_path / f"pack-{locale}"
    extensions = root / "usr/lib/firefox-esr/browser/extensions"
    extensions.mkdir(parents=True)
    with zipfile.ZipFile(extensions / f"langpack-{locale}.xpi", "w") as xpi:
        xpi.writestr(f"localization/{locale}/browser/app.ftl", FLUENT[locale])
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        f"Package: firefox-esr-l10n-{locale}\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: test <test@example.org>\nDescription: test pack\n"
    )
    deb = tmp_path / f"firefox-esr-l10n-{locale}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True, capture_output=True)
    return deb


def test_fluent_messages_keep_text_and_attributes_and_drop_placeables():
    assert fluent_messages(FLUENT["en"]) == {
        "hello": "Hello , welcome",
        "bye": "Goodbye",
        "bye.title": "Leave",
        "only-en": "x",
    }


def test_parallel_texts_keep_the_messages_every_pack_has_in_one_order(tmp_path):
    texts = parallel_texts(
        {"english": language_pack_deb(tmp_path, "en"), "korean": language_pack_deb(tmp_path, "ko")}
    )
    assert texts == {
        "english": "Goodbye\nLeave\nHello , welcome",
        "korean": "안녕히 가세요\n나가기\n님, 환영합니다",
    }


def test_compare_reads_language_packs(shared_dir, tmp_path, capsys):
    english, korean = language_pack_deb(tmp_path, "en"), language_pack_deb(tmp_path, "ko")
    cl100k = shared_dir / "tokenizers" / "tiktoken" / "cl100k_base.tiktoken"
    arguments = ["tokenizers", "compare", "--tokenizer", f"cl100k={cl100k}"]
    arguments += ["--firefox-l10n", f"english={english}", "--firefox-l10n", f"korean={korean}"]
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(arguments)
    assert args.func(args) == 0
    assert "korean" in capsys.readouterr().out


def test_a_file_that_is_no_package_is_refused(tmp_path):
    path = tmp_path / "not.deb"
    path.write_bytes(b"hello")
    with pytest.raises(ValueError, match="not a Debian package"):
        parallel_texts({"english": path})
