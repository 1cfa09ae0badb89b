"""ember's GGUF reader hands out what the gguf package's GGUFReader does: every metadata value, and each tensor's
bytes typed and shaped the same way, for plain and block types alike."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from ember.gguf_file import GGUFFile, read_gguf_metadata


def _write(path, rng: np.random.Generator) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_string("general.name", "tiny, ünïcode")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b", "ab", ""])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.0, -0.25, 3.0])
    writer.add_key_value("custom.flag", True, GGUFValueType.BOOL)
    writer.add_key_value("custom.big", 2**40 + 3, GGUFValueType.UINT64)
    writer.add_tensor("norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.add_tensor("half.weight", rng.standard_normal((3, 64)).astype(np.float16))
    for name, qtype in (("q8.weight", T.Q8_0), ("q4.weight", T.Q4_1), ("bf16.weight", T.BF16)):
        raw = quantize(rng.standard_normal((8, 256)).astype(np.float32), qtype)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_metadata_and_tensors_equal_the_gguf_packages_reader(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(path, np.random.default_rng(0))
    ours, reference = GGUFFile.open(path), GGUFReader(str(path))
    expected = {key: field.contents() for key, field in reference.fields.items() if not key.startswith("GGUF.")}
    assert ours.metadata == expected
    assert ours.value_types["tokenizer.ggml.tokens"] == (GGUFValueType.ARRAY, GGUFValueType.STRING)
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type and mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data) and mine.n_bytes == int(theirs.n_bytes)
    assert read_gguf_metadata(path, prefixes=("tokenizer.",)) == {k: v for k, v in expected.items() if k.startswith("tokenizer.")}


def test_copy_metadata_writes_the_same_entries_back(tmp_path):
    path, copy = tmp_path / "tiny.gguf", tmp_path / "copy.gguf"
    _write(path, np.random.default_rng(1))
    source = GGUFFile.open(path)
    writer = GGUFWriter(str(copy), source.metadata["general.architecture"])
    source.copy_metadata(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert GGUFFile.open(copy).metadata == source.metadata
    assert GGUFFile.open(copy).value_types == source.value_types


def test_a_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(path, np.random.default_rng(2))
    data = path.read_bytes()
    (tmp_path / "head.gguf").write_bytes(data[:200])
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile.open(tmp_path / "head.gguf")
    (tmp_path / "body.gguf").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="runs past the end"):
        GGUFFile.open(tmp_path / "body.gguf")
    (tmp_path / "not.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile.open(tmp_path / "not.gguf")
