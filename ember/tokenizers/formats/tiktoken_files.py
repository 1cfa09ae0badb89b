"""tiktoken `.tiktoken` rank files (one "base64(token) rank" line per token) and the known
encodings built on them: r50k, p50k, cl100k, o200k and Llama 3.

A rank file carries neither the pre-tokenizer pattern nor the special tokens; they are facts
of each published encoding, recognised here by the number of ranks in the file.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from ember.tokenizers.bpe.byte_level_bpe import ByteLevelBPETokenizer
from ember.tokenizers.bpe.merges import BytePairMerger, pair_table_from_ranks
from ember.tokenizers.text.patterns import NAMED_PATTERNS, PreTokenizer


def _llama3_specials() -> dict[str, int]:
    names = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|reserved_special_token_2|>",
        "<|reserved_special_token_3|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|reserved_special_token_4|>",
        "<|eot_id|>",
    ]
    names += [f"<|reserved_special_token_{i}|>" for i in range(5, 256 - 5)]
    return {name: 128000 + offset for offset, name in enumerate(names)}


@dataclass(frozen=True)
class TiktokenEncodingSpec:
    """What a rank file lacks: the pattern, the special tokens, BOS/EOS and end-of-turn ids."""

    name: str
    pattern_name: str
    special_tokens: dict[str, int] = field(default_factory=dict)
    bos_token: str | None = None
    eos_token: str | None = None
    end_of_turn_tokens: tuple[str, ...] = ()
    add_bos: bool = False


ENDOFTEXT = "<|endoftext|>"
KNOWN_ENCODINGS: dict[str, TiktokenEncodingSpec] = {
    "r50k_base": TiktokenEncodingSpec("r50k_base", "r50k", {ENDOFTEXT: 50256}, None, ENDOFTEXT),
    "p50k_base": TiktokenEncodingSpec("p50k_base", "p50k", {ENDOFTEXT: 50256}, None, ENDOFTEXT),
    "cl100k_base": TiktokenEncodingSpec(
        "cl100k_base",
        "cl100k",
        {
            ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
        None,
        ENDOFTEXT,
    ),
    "o200k_base": TiktokenEncodingSpec(
        "o200k_base", "o200k", {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}, None, ENDOFTEXT
    ),
    "llama3": TiktokenEncodingSpec(
        "llama3",
        "llama3",
        _llama3_specials(),
        "<|begin_of_text|>",
        "<|end_of_text|>",
        ("<|eot_id|>", "<|eom_id|>"),
        add_bos=True,
    ),
}
# Rank counts of the published files: how a bare rank file is recognised.
ENCODING_BY_RANK_COUNT = {
    50256: "r50k_base",
    50280: "p50k_base",
    100256: "cl100k_base",
    199998: "o200k_base",
    128000: "llama3",
}


def read_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """token bytes -> rank of a `.tiktoken` file image; ValueError on a malformed line."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as error:
            raise ValueError(f"line {number} is not 'base64 rank': {line[:60]!r}") from error
    return ranks


def looks_like_tiktoken(head: bytes) -> bool:
    """Whether the first bytes of a file look like a rank file."""
    lines = head.splitlines()[:4]
    if not lines:
        return False
    for line in lines[:-1] if len(lines) > 1 else lines:
        parts = line.split(b" ")
        if len(parts) != 2 or not parts[1].isdigit():
            return False
        try:
            base64.b64decode(parts[0], validate=True)
        except ValueError:
            return False
    return True


def tokenizer_from_ranks(
    ranks: dict[bytes, int], spec: TiktokenEncodingSpec
) -> ByteLevelBPETokenizer:
    """A byte-level BPE tokenizer that encodes exactly as tiktoken does with these ranks."""
    size = max(ranks.values()) + 1
    token_bytes: list[bytes | None] = [None] * size
    for token, rank in ranks.items():
        token_bytes[rank] = token
    byte_ids = [ranks.get(bytes([byte])) for byte in range(256)]
    merger = BytePairMerger(byte_ids, pair_table_from_ranks(ranks))
    specials = spec.special_tokens

    def lookup(name: str | None) -> int | None:
        return None if name is None else specials.get(name)

    return ByteLevelBPETokenizer(
        merger=merger,
        pre_tokenizer=PreTokenizer.named(spec.pattern_name),
        token_bytes_by_id=token_bytes,
        special_tokens=specials,
        bos_id=lookup(spec.bos_token),
        eos_id=lookup(spec.eos_token),
        extra_eos_ids=[specials[name] for name in spec.end_of_turn_tokens if name in specials],
        add_bos=spec.add_bos,
        # tiktoken takes a piece that is itself a token whole, before any merging; Llama 3
        # has tokens that merges alone never reach.
        ignore_merges=True,
        name=spec.name,
    )


def load_tiktoken(
    path: str | Path,
    encoding: str | None = None,
    *,
    pattern: str | None = None,
    special_tokens: dict[str, int] | None = None,
) -> ByteLevelBPETokenizer:
    """The tokenizer of a rank file.

    `encoding` names a known encoding (r50k_base, p50k_base, cl100k_base, o200k_base, llama3);
    without it the encoding is recognised by the file's rank count. For any other rank file
    pass `pattern` (a name in NAMED_PATTERNS) and optionally `special_tokens`.
    """
    ranks = read_tiktoken_ranks(Path(path).read_bytes())
    if pattern is not None:
        if pattern not in NAMED_PATTERNS:
            raise ValueError(f"unknown pattern {pattern!r}; known: {sorted(NAMED_PATTERNS)}")
        spec = TiktokenEncodingSpec(Path(path).stem, pattern, dict(special_tokens or {}))
        return tokenizer_from_ranks(ranks, spec)
    name = encoding or ENCODING_BY_RANK_COUNT.get(len(ranks))
    if name is None or name not in KNOWN_ENCODINGS:
        raise ValueError(
            f"{path}: a rank file with {len(ranks)} ranks is not a known encoding "
            f"({', '.join(KNOWN_ENCODINGS)}); call ember.tokenizers.load_tiktoken(path, "
            "pattern=NAME, special_tokens={...}) to say how its text is pre-tokenized"
        )
    return tokenizer_from_ranks(ranks, KNOWN_ENCODINGS[name])
