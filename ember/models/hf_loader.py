"""HF model folders: config.json plus one or more (indexed) .safetensors files, read lazily; or, where a folder has
none (older checkpoints: OPT, Pythia, many fine-tunes), PyTorch's pytorch_model*.bin files, memory-mapped and read
with `weights_only` (tensors only: a pickle cannot run code on loading)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ember.config.model import ModelConfig
from ember.models.family_registry import config_from_hf
from ember.quant.checkpoint import SourceNames


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_hf_config(folder: Path) -> ModelConfig:
    with open(folder / "config.json", encoding="utf-8") as f:
        return config_from_hf(json.load(f))


def checkpoint_files(folder: Path) -> list[Path]:
    """The weight files of a folder: its safetensors shards, else its PyTorch .bin shards (from the index when there is
    one); FileNotFoundError when it has neither."""
    if (folder / "model.safetensors.index.json").is_file() or any(folder.glob("*.safetensors")):
        return safetensors_files(folder)
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            return [folder / name for name in sorted(set(json.load(f)["weight_map"].values()))]
    files = sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"{folder} has a config.json but no weights (.safetensors or pytorch_model.bin)")
    return files


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


def hf_source_names(folder: Path) -> SourceNames:
    """The folder's safetensors tensors, named as the model names them (transformers' names), for writing it back
    quantized."""
    names: dict[str, str | None] = {}
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as shard:
            names.update((name, name) for name in shard.keys())  # noqa: SIM118 (safe_open is not iterable)
    return SourceNames(names)


def iter_hf_tensors(
    folder: Path,
    select: Callable[[str], tuple[int, int, int] | None] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs, memory-mapped: nothing is read until a tensor is used.

    `select(name)` -> (dim, start, stop) reads only those rows (dim 0) or columns (dim 1) of
    the tensor (a tensor-parallel rank's slice); None reads it whole. Tensors `keep` says no to
    (another rank's layers or experts) are skipped unread.
    """
    for file in checkpoint_files(folder):
        if file.suffix == ".bin":
            yield from _pickled_tensors(file, select, keep)
            continue
        with safe_open(str(file), framework="pt") as shard:
            for stored in shard.keys():  # noqa: SIM118 (safe_open is not a dict)
                name = text_model_name(stored)
                if name is None or (keep is not None and not keep(name)):
                    continue
                part = select(name) if select is not None else None
                if part is None:
                    yield name, shard.get_tensor(stored)
                    continue
                dim, start, stop = part
                view = shard.get_slice(stored)
                yield name, view[start:stop] if dim == 0 else view[:, start:stop]


def _pickled_tensors(
    file: Path, select: Callable[[str], tuple[int, int, int] | None] | None, keep: Callable[[str], bool] | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a PyTorch .bin file (tensors only), memory-mapped where its format allows."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (pre-zip) format cannot be memory-mapped
        state = torch.load(file, map_location="cpu", weights_only=True)
    for stored, tensor in state.items():
        name = text_model_name(stored)
        if name is None or (keep is not None and not keep(name)):
            continue
        part = select(name) if select is not None else None
        if part is None:
            yield name, tensor
            continue
        dim, start, stop = part
        yield name, tensor[start:stop] if dim == 0 else tensor[:, start:stop]


# An image-text checkpoint (Gemma 3 4B and up) wraps its language model: its tensors under these prefixes, as
# transformers saves them and as it names them in memory, beside the vision tower and projector ember does not run.
_LANGUAGE_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                            "language_model.lm_head.": "lm_head."}
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def text_model_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model ember runs; None for an image-text checkpoint's vision parts."""
    if name.startswith(_VISION_PREFIXES):
        return None
    prefix = next((p for p in _LANGUAGE_MODEL_PREFIXES if name.startswith(p)), None)
    return name if prefix is None else _LANGUAGE_MODEL_PREFIXES[prefix] + name.removeprefix(prefix)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.bpe", "merges.txt", "tokenizer.bin")


def find_hf_tokenizer(folder: Path) -> Path | None:
    """The folder itself when it holds a tokenizer file (ember.tokenizers.load picks which), else None."""
    return folder if any((folder / name).is_file() for name in TOKENIZER_FILES) else None
