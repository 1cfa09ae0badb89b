"""GGUF vocab-only files written with the `gguf` package from reference tokenizers, read back
by ember: "llama" (SentencePiece BPE, from Llama 2's tokenizer.model, reference sentencepiece)
and "gpt2" with pre "qwen2" (from Qwen2.5's tokenizer.json, reference `tokenizers`)."""

from __future__ import annotations

import json

import pytest
from tok_corpus import build_corpus
from tok_gguf_writer import write_vocab_gguf

from ember.tokenizers import SentencePieceBPETokenizer, load


def test_llama_gguf_vocab_matches_sentencepiece(shared_dir, tmp_path):
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2

    model_path = shared_dir / "tokenizers" / "llama2" / "tokenizer.model"
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_path.read_bytes())
    path = tmp_path / "llama2-vocab.gguf"
    write_vocab_gguf(
        path,
        "llama",
        tokens=[piece.piece for piece in proto.pieces],
        types=[piece.type for piece in proto.pieces],
        token_scores=[piece.score for piece in proto.pieces],
        bos_token_id=1,
        eos_token_id=2,
        unk_token_id=0,
        add_bos_token=True,
    )
    ours = load(path)
    assert isinstance(ours, SentencePieceBPETokenizer)
    assert (ours.bos_id, ours.eos_id, ours.add_bos) == (1, 2, True)
    reference = spm.SentencePieceProcessor(model_file=str(model_path))
    for text in build_corpus(shared_dir, count=1000, seed=40):
        assert ours.encode(text, allowed_special=()) == reference.encode(text), text
    # Chat templates render control tokens as text: they are matched, and a dummy space
    # follows them (llama.cpp and HF behave so).
    assert ours.encode("<s>Hi") == [1, *reference.encode("Hi")]


def test_qwen2_gguf_vocab_matches_tokenizers(shared_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    spec_path = shared_dir / "tokenizers" / "qwen2.5" / "tokenizer.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    vocab = dict(spec["model"]["vocab"])
    types = {}
    for entry in spec["added_tokens"]:
        vocab[entry["content"]] = entry["id"]
        types[entry["id"]] = 3 if entry["special"] else 4
    tokens = [""] * (max(vocab.values()) + 1)
    for token, token_id in vocab.items():
        tokens[token_id] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    path = tmp_path / "qwen-vocab.gguf"
    write_vocab_gguf(
        path,
        "gpt2",
        tokens=tokens,
        types=[types.get(i, 1) for i in range(len(tokens))],
        token_merges=merges,
        tokenizer_pre="qwen2",
        eos_token_id=vocab["<|im_end|>"],
    )
    ours = load(path)
    reference = tokenizers.Tokenizer.from_file(str(spec_path))
    specials = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>")
    for text in build_corpus(shared_dir, count=1000, seed=41, specials=specials):
        assert ours.encode(text) == reference.encode(text).ids, text
    assert vocab["<|im_end|>"] in ours.eos_ids
