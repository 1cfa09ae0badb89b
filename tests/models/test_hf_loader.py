"""HF safetensors folders: sharded checkpoints with an index load the same weights as one file."""

from __future__ import annotations

import pytest
import torch
import transformers

from ember.models.family_registry import config_from_hf
from ember.models.hf_loader import safetensors_files
from ember.models.loader import load_model
from tests.model_factory import load_reference, save_tiny_model


def test_a_sharded_checkpoint_loads_the_same_model_as_a_single_file(tmp_path):
    single = save_tiny_model("llama", tmp_path / "single")
    reference = load_reference(single)
    reference.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(safetensors_files(tmp_path / "sharded")) > 1
    whole = load_model(single).model.state_dict()
    pieces = load_model(tmp_path / "sharded").model.state_dict()
    assert whole.keys() == pieces.keys()
    assert all(torch.equal(whole[name], pieces[name]) for name in whole)


def test_bfloat16_loading_casts_every_weight(tmp_path):
    folder = save_tiny_model("qwen2", tmp_path / "qwen2")
    model = load_model(folder, dtype="bfloat16").model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_the_tokenizer_of_a_folder_is_found_whatever_file_holds_it(tmp_path, shared_dir):
    import shutil

    from ember.models.hf_loader import find_hf_tokenizer
    from ember.tokenizers import load

    folder = save_tiny_model("llama", tmp_path / "with-sentencepiece")
    assert find_hf_tokenizer(folder) is None
    shutil.copy(shared_dir / "tokenizers" / "llama2" / "tokenizer.model", folder / "tokenizer.model")
    assert find_hf_tokenizer(folder) == folder
    assert load(folder).encode("Hello world") == load(folder / "tokenizer.model").encode("Hello world")


def test_a_phi3_config_reads_as_phi3_with_its_partial_rotation():
    shape = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, pad_token_id=0)
    assert config_from_hf(transformers.Phi3Config(**shape).to_dict()).rotary_dim is None
    assert config_from_hf(transformers.Phi3Config(**shape, partial_rotary_factor=0.75).to_dict()).rotary_dim == 12


def test_a_pytorch_bin_checkpoint_loads_the_same_weights(tmp_path):
    """Older folders (OPT, Pythia, many fine-tunes) hold pytorch_model.bin rather than safetensors: read tensors-only."""
    single = save_tiny_model("qwen2", tmp_path / "single")
    state = load_reference(single).state_dict()
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "config.json").write_bytes((single / "config.json").read_bytes())
    torch.save(state, binary / "pytorch_model.bin")
    whole = load_model(single).model.state_dict()
    from_bin = load_model(binary).model.state_dict()
    assert whole.keys() == from_bin.keys()
    assert all(torch.equal(whole[name], from_bin[name]) for name in whole)


def test_a_folder_without_weights_is_refused_naming_both_formats(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "empty")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors or pytorch_model.bin"):
        load_model(folder)
