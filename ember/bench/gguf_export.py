"""Write an F32 or BF16 GGUF of the very weights ember runs, for llama.cpp at the same precision (and, for vLLM, a
transformers folder of them: `export_hf_folder`).

The source GGUF's tensors are dequantized exactly as ember's loader does and written in
llama.cpp's own layout (its q/k row permutation is kept: the file is for llama.cpp, not for
transformers' naming), with every metadata field (tokenizer, chat template) copied over.
1-D tensors (norms) stay F32, as llama.cpp's converters write them.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

FILE_TYPES = {"float32": 0, "bfloat16": 32}  # llama.cpp's LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_BF16


def export_gguf(source: Path, target: Path, dtype: str) -> Path:
    """Write `target` (skipped when it exists and is newer than `source`); returns it."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    from ember.gguf_file import GGUFFile

    if dtype not in FILE_TYPES:
        raise ValueError(f"llama.cpp export dtype must be one of {', '.join(FILE_TYPES)}")
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    reader = GGUFFile.open(source)
    partial = target.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(partial), reader.metadata["general.architecture"])
    reader.copy_metadata(writer, skip=("general.file_type", "general.quantization_version"))
    writer.add_file_type(FILE_TYPES[dtype])
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        values = np.ascontiguousarray(values.reshape([int(d) for d in reversed(tensor.shape)]))
        if dtype == "bfloat16" and values.ndim > 1:
            writer.add_tensor(tensor.name, quantize(values, GGMLQuantizationType.BF16), raw_dtype=GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(target)
    return target


def export_hf_folder(source: Path, target: Path, dtype: str) -> Path:
    """Write `target`, a transformers folder (config, safetensors, tokenizer) of `source`'s weights at `dtype`, for
    peers that read only such folders (vLLM); skipped when its config is newer than `source`. Returns it.

    transformers dequantizes the GGUF's blocks and undoes llama.cpp's q/k row permutation, as the HF peer loads it.
    """
    import shutil

    if dtype not in FILE_TYPES:
        raise ValueError(f"HF folder export dtype must be one of {', '.join(FILE_TYPES)}")
    config = target / "config.json"
    if config.is_file() and config.stat().st_mtime >= source.stat().st_mtime:
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with contextlib.redirect_stderr(io.StringIO()):  # transformers draws progress bars while it converts and writes
        _save_transformers_folder(source, partial, dtype)
    shutil.rmtree(target, ignore_errors=True)
    partial.replace(target)
    return target


def _save_transformers_folder(source: Path, folder: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=getattr(torch, dtype))
    # A GGUF-loaded model keeps its quantizer and refuses to save: the same weights go into a plain model of its config.
    config = loaded.config
    del config.quantization_config  # else readers of the folder (vLLM) look for GGUF blocks in it
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name).save_pretrained(folder)
