"""HF safetensors folders: config.json plus one or more (indexed) .safetensors files, read lazily."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ember.models.config import ModelConfig


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_hf_config(folder: Path) -> ModelConfig:
    with open(folder / "config.json", encoding="utf-8") as f:
        return ModelConfig.from_hf(json.load(f))


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's shard files, from the index when there is one."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has a config.json but no .safetensors weights")
    return files


def iter_hf_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs, memory-mapped: nothing is read until a tensor is used."""
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as shard:
            for name in shard.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, shard.get_tensor(name)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.bpe", "tokenizer.bin")


def find_hf_tokenizer(folder: Path) -> Path | None:
    """The folder itself when it holds a tokenizer file (ember.tokenizers.load picks which), else None."""
    return folder if any((folder / name).is_file() for name in TOKENIZER_FILES) else None
