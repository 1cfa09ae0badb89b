"""Tokenizers from GGUF metadata (`tokenizer.ggml.*`), for model files and vocab-only files.

`tokenizer.ggml.model` says which algorithm: "gpt2" is byte-level BPE with a merge list and a
pre-tokenizer named by `tokenizer.ggml.pre`; "llama" is SentencePiece-style BPE with scores;
"bert" is llama.cpp's WordPiece. Control (3) tokens are matched whole in text when allowed
(chat templates render them as text), user-defined (4) ones always, as llama.cpp does, in
llama.cpp's order (longest token first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.gguf_file import read_gguf_metadata
from ember.tokenizers.base import Tokenizer
from ember.tokenizers.bpe.byte_level_bpe import ByteLevelBPETokenizer
from ember.tokenizers.bpe.merges import MAX_VOCAB, BytePairMerger, pair_key, pair_value
from ember.tokenizers.formats.gguf.pre_tokenizers import gguf_pre_tokenizer
from ember.tokenizers.formats.gguf.wordpiece import GGUFWordPieceTokenizer
from ember.tokenizers.sentencepiece.bpe import SentencePieceBPETokenizer, SentencePieceOptions
from ember.tokenizers.text.byte_level import ByteLevelCodec
from ember.tokenizers.text.pieces import PieceKind

# Text of tokens that end a turn in common chat formats: generation stops on them too.
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
)


def load_gguf(path: str | Path) -> Tokenizer:
    """The tokenizer stored in a GGUF file."""
    metadata = read_gguf_metadata(path, prefixes=("tokenizer.",))
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise ValueError(f"{path}: this GGUF file has no tokenizer.ggml.model metadata")
    if model == "gpt2":
        return byte_level_from_gguf(metadata, name=f"gguf:{Path(path).name}")
    if model == "llama":
        return sentencepiece_from_gguf(metadata, name=f"gguf:{Path(path).name}")
    if model == "bert":
        return wordpiece_from_gguf(metadata, name=f"gguf:{Path(path).name}")
    raise ValueError(
        f"{path}: GGUF tokenizer model {model!r} is not supported by ember.tokenizers "
        "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE, 'bert' WordPiece)"
    )


def _special_ids(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> dict[str, Any]:
    def optional(key: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        return None if value is None or value < 0 or value >= len(tokens) else int(value)

    eos_id = optional("eos_token_id")
    eot_id = optional("eot_token_id")
    extra = {eot_id} if eot_id is not None else set()
    for token_id, (token, kind) in enumerate(zip(tokens, types, strict=False)):
        if kind in (PieceKind.CONTROL, PieceKind.USER_DEFINED) and token in END_OF_TURN_TOKENS:
            extra.add(token_id)
    return {
        "bos_id": optional("bos_token_id"),
        "eos_id": eos_id,
        "extra_eos_ids": sorted(extra),
        "chat_template": metadata.get("tokenizer.chat_template"),
    }


def byte_level_from_gguf(metadata: dict[str, Any], name: str = "gguf") -> ByteLevelBPETokenizer:
    """A byte-level BPE tokenizer from `tokenizer.ggml.*` metadata of model "gpt2"."""
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata.get("tokenizer.ggml.token_type") or [PieceKind.NORMAL] * len(tokens))
    merges: list[str] = list(metadata.get("tokenizer.ggml.merges") or [])
    pre = gguf_pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
    if len(tokens) > MAX_VOCAB:
        raise ValueError(f"vocabulary of {len(tokens)} tokens exceeds ember's limit {MAX_VOCAB}")
    codec = ByteLevelCodec()
    token_bytes: list[bytes | None] = []
    special_tokens: dict[str, int] = {}
    control_ids: list[int] = []
    for token_id, (token, kind) in enumerate(zip(tokens, types, strict=False)):
        if kind in (PieceKind.CONTROL, PieceKind.USER_DEFINED):
            special_tokens[token] = token_id
            token_bytes.append(None)
            if kind == PieceKind.CONTROL:
                control_ids.append(token_id)
            continue
        try:
            token_bytes.append(codec.to_bytes(token))
        except ValueError:
            token_bytes.append(token.encode())
    merger = merger_from_merge_list(tokens, merges, codec)
    return ByteLevelBPETokenizer(
        merger=merger,
        pre_tokenizer=pre.build(),
        ignore_merges=pre.ignore_merges,
        token_bytes_by_id=token_bytes,
        special_tokens=special_tokens,
        special_ids=control_ids,
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        longest_special_first=True,
        name=name,
        **_special_ids(metadata, tokens, types),
    )


def merger_from_merge_list(
    tokens: list[str], merges: list[str] | list[tuple[str, str]], codec: ByteLevelCodec
) -> BytePairMerger:
    """A merger from HF/GGUF data: tokens by id in the byte-level alphabet, merges in priority
    order as "left right" strings or (left, right) pairs."""
    ids = {token: token_id for token_id, token in enumerate(tokens)}
    table: dict[int, int] = {}
    for rank, merge in enumerate(merges):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        left_id, right_id, merged_id = ids.get(left), ids.get(right), ids.get(left + right)
        if left_id is None or right_id is None or merged_id is None:
            continue  # a merge whose result is not in the vocabulary never applies
        key = pair_key(left_id, right_id)
        if key not in table:
            table[key] = pair_value(rank, merged_id)
    byte_ids = [ids.get(codec.to_text(bytes([byte]))) for byte in range(256)]
    return BytePairMerger(byte_ids, table)


def sentencepiece_from_gguf(
    metadata: dict[str, Any], name: str = "gguf"
) -> SentencePieceBPETokenizer:
    """A SentencePiece-style BPE tokenizer from `tokenizer.ggml.*` metadata of model "llama"."""
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    count = len(tokens)
    scores = list(metadata.get("tokenizer.ggml.scores") or [0.0] * count)
    types = [
        PieceKind(kind)
        for kind in (metadata.get("tokenizer.ggml.token_type") or [PieceKind.NORMAL] * count)
    ]
    options = SentencePieceOptions(
        add_dummy_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", True)),
        longest_special_first=True,
    )
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    return SentencePieceBPETokenizer(
        pieces=tokens,
        scores=scores,
        kinds=types,
        options=options,
        unk_id=None if unk is None else int(unk),
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
        name=name,
        **_special_ids(metadata, tokens, types),
    )


def wordpiece_from_gguf(metadata: dict[str, Any], name: str = "gguf") -> GGUFWordPieceTokenizer:
    """llama.cpp's WordPiece tokenizer from `tokenizer.ggml.*` metadata of model "bert"."""
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    kinds = list(metadata.get("tokenizer.ggml.token_type") or [PieceKind.NORMAL] * len(tokens))

    def token_id(*keys: str) -> int | None:
        for key in keys:
            value = metadata.get(f"tokenizer.ggml.{key}")
            if value is not None and 0 <= value < len(tokens):
                return int(value)
        return None

    unk_id = token_id("unknown_token_id")
    if unk_id is None:
        raise ValueError(f"{name}: a 'bert' GGUF vocabulary needs tokenizer.ggml.unknown_token_id")
    # llama.cpp's defaults: lowercase on, strip_accents as lowercase unless stored.
    lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    strip_accents = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    return GGUFWordPieceTokenizer(
        tokens=tokens,
        kinds=[PieceKind(kind) for kind in kinds],
        unk_id=unk_id,
        cls_id=token_id("bos_token_id", "cls_token_id"),
        sep_id=token_id("seperator_token_id"),  # sic: llama.cpp's key
        lowercase=lowercase,
        strip_accents=strip_accents,
        name=name,
    )
