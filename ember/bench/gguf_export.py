"""Write an F32 or BF16 GGUF of the very weights ember runs, for llama.cpp at the same precision.

The source GGUF's tensors are dequantized exactly as ember's loader does and written in
llama.cpp's own layout (its q/k row permutation is kept: the file is for llama.cpp, not for
transformers' naming), with every metadata field (tokenizer, chat template) copied over.
1-D tensors (norms) stay F32, as llama.cpp's converters write them.
"""

from __future__ import annotations

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
