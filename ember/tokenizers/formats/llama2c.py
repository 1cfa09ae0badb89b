"""llama2.c `tokenizer.bin` files: int32 max_token_length, then per token float32 score,
int32 byte length and the bytes. Pieces keep real spaces; ids 0/1/2 are <unk>/BOS/EOS and
the 256 byte-fallback pieces `<0xNN>` sit at ids 3..258."""

from __future__ import annotations

import struct
from pathlib import Path

from ember.tokenizers.sentencepiece.bpe import SentencePieceBPETokenizer, SentencePieceOptions
from ember.tokenizers.text.pieces import PieceKind, byte_of_piece

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


def read_llama2c_vocab(data: bytes) -> tuple[int, list[str], list[float]]:
    """(max_token_length, pieces, scores) of a tokenizer.bin image; ValueError if malformed."""
    if len(data) < 4:
        raise ValueError("too short to be a llama2.c tokenizer.bin")
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    offset = 4
    pieces: list[str] = []
    scores: list[float] = []
    while offset < len(data):
        if offset + 8 > len(data):
            raise ValueError(f"truncated token header at byte {offset}")
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        if length < 0 or length > max_token_length or offset + length > len(data):
            raise ValueError(f"bad token length {length} at byte {offset - 4}")
        pieces.append(data[offset : offset + length].decode("utf-8", errors="surrogateescape"))
        scores.append(score)
        offset += length
    return max_token_length, pieces, scores


def looks_like_llama2c(data: bytes) -> bool:
    """Whether `data` parses as a llama2.c vocabulary with its byte pieces at ids 3..258."""
    if len(data) < 4:
        return False
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    if not 0 < max_token_length < 4096:
        return False
    try:
        _, pieces, _ = read_llama2c_vocab(data)
    except (ValueError, struct.error):
        return False
    return len(pieces) > 258 and pieces[3] == "<0x00>" and pieces[258] == "<0xFF>"


def load_llama2c(path: str | Path) -> SentencePieceBPETokenizer:
    """The tokenizer of a llama2.c `tokenizer.bin`, encoding exactly as llama2.c's run.c."""
    data = Path(path).read_bytes()
    _, pieces, scores = read_llama2c_vocab(data)
    if len(pieces) <= EOS_ID:
        raise ValueError(f"{path}: a llama2.c vocabulary needs at least <unk>, BOS and EOS")
    kinds = []
    for token_id, piece in enumerate(pieces):
        if token_id == UNK_ID:
            kinds.append(PieceKind.UNKNOWN)
        elif token_id in (BOS_ID, EOS_ID):
            kinds.append(PieceKind.CONTROL)
        elif byte_of_piece(piece) is not None:
            kinds.append(PieceKind.BYTE)
        else:
            kinds.append(PieceKind.NORMAL)
    # run.c looks every merged string up in the whole vocabulary and never matches
    # special-token text in the input.
    options = SentencePieceOptions(space_marker=" ", merge_kinds=frozenset(PieceKind))
    return SentencePieceBPETokenizer(
        pieces=pieces,
        scores=scores,
        kinds=kinds,
        options=options,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        # run.c ends generation at BOS too: llama2.c models open the next story with it.
        extra_eos_ids=(BOS_ID,),
        unk_id=UNK_ID,
        add_bos=True,
        special_tokens={},
        name=f"llama2c:{Path(path).name}",
    )
