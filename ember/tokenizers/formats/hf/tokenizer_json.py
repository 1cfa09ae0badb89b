"""HF `tokenizer.json` files and GPT-2's `encoder.json` + `vocab.bpe`.

Byte-level BPE (ByteLevel, Split "Isolated" and Digits pre-tokenizers, no normalizer but NFC)
runs on the fast `ByteLevelBPETokenizer`; everything else (WordPiece, BPE over Metaspace
pieces with byte fallback, Unigram, the other normalizers and pre-tokenizers, single_word
added tokens) runs on `formats.hf.pipeline.PipelineTokenizer`. A part neither knows raises a
ValueError naming it, so a tokenizer is never silently approximated.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

from ember.tokenizers.base import Tokenizer
from ember.tokenizers.bpe.byte_level_bpe import ByteLevelBPETokenizer
from ember.tokenizers.formats.gguf.vocab import merger_from_merge_list
from ember.tokenizers.formats.hf.folder import (
    chat_template_of,
    read_tokenizer_config,
    stop_token_ids,
)
from ember.tokenizers.formats.hf.pipeline import PipelineTokenizer
from ember.tokenizers.text.byte_level import ByteLevelCodec
from ember.tokenizers.text.patterns import GPT2_PATTERN, PreTokenizer, for_oniguruma

SINGLE_DIGITS, DIGIT_RUNS = r"\p{N}", r"\p{N}+"


def _unsupported(what: str, value: Any) -> ValueError:
    return ValueError(
        f"tokenizer.json {what} {json.dumps(value)[:200]} is not supported by ember.tokenizers "
        "(supported: byte-level BPE with ByteLevel/Split/Digits pre-tokenizers)"
    )


def pre_tokenizer_stages(spec: dict[str, Any] | None) -> list[str]:
    """The regex stages equivalent to an HF pre_tokenizer spec."""
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        return [stage for part in spec["pretokenizers"] for stage in pre_tokenizer_stages(part)]
    if kind == "ByteLevel":
        if spec.get("add_prefix_space"):
            raise _unsupported("pre_tokenizer", spec)
        return [GPT2_PATTERN] if spec.get("use_regex", True) else []
    if kind == "Digits":
        return [SINGLE_DIGITS if spec.get("individual_digits") else DIGIT_RUNS]
    if kind == "Split":
        pattern = spec.get("pattern", {})
        if spec.get("behavior") != "Isolated" or spec.get("invert") or "Regex" not in pattern:
            raise _unsupported("pre_tokenizer", spec)
        return [for_oniguruma(pattern["Regex"])]
    raise _unsupported("pre_tokenizer", spec)


def load_tokenizer_json(path: str | Path) -> Tokenizer:
    """The tokenizer of an HF tokenizer.json file: byte-level BPE runs on the fast
    `ByteLevelBPETokenizer`, every other model and pipeline on `PipelineTokenizer`."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    if is_plain_byte_level_bpe(spec):
        return _byte_level_from_spec(spec, Path(path))
    folder = Path(path).parent
    config = read_tokenizer_config(folder)
    added = {entry["content"]: entry["id"] for entry in spec.get("added_tokens", [])}
    tokenizer = PipelineTokenizer(spec, name=f"tokenizer.json:{folder.name}", chat_template=chat_template_of(folder, config),
                                  extra_eos_ids=stop_token_ids(folder, added))
    specials = tokenizer.special_tokens
    for key, attribute in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        if isinstance(config.get(key), str) and config[key] in specials:
            setattr(tokenizer, attribute, specials[config[key]])
    return tokenizer


def is_plain_byte_level_bpe(spec: dict[str, Any]) -> bool:
    """Whether `ByteLevelBPETokenizer` runs this spec exactly: a BPE model on GPT-2's byte
    alphabet with no byte fallback, subword prefix or suffix, no normalizer but NFC,
    pre-tokenizers it knows, and no single_word added token."""
    model = spec.get("model", {})
    if model.get("type") != "BPE" or any(
        model.get(option)
        for option in ("byte_fallback", "continuing_subword_prefix", "end_of_word_suffix")
    ):
        return False
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return False
    if any(entry.get("single_word") for entry in spec.get("added_tokens", [])):
        return False
    pre_tokenizer = spec.get("pre_tokenizer")
    decoder = spec.get("decoder") or {}
    if "ByteLevel" not in json.dumps(pre_tokenizer) and decoder.get("type") != "ByteLevel":
        return False
    try:
        pre_tokenizer_stages(pre_tokenizer)
    except ValueError:
        return False
    return True


def _byte_level_from_spec(spec: dict[str, Any], path: Path) -> ByteLevelBPETokenizer:
    model = spec["model"]
    normalizer = spec.get("normalizer")
    vocab: dict[str, int] = model["vocab"]
    added = spec.get("added_tokens", [])
    tokens_by_id = {token_id: token for token, token_id in vocab.items()}
    size = max([*tokens_by_id, *(entry["id"] for entry in added)], default=-1) + 1
    tokens = [tokens_by_id.get(token_id, "") for token_id in range(size)]
    codec = ByteLevelCodec()
    token_bytes: list[bytes | None] = []
    for token in tokens:
        try:
            token_bytes.append(codec.to_bytes(token) if token else None)
        except ValueError:
            token_bytes.append(token.encode())
    special_tokens = {entry["content"]: entry["id"] for entry in added}
    special_ids = [entry["id"] for entry in added if entry.get("special")]
    for entry in added:
        token_bytes[entry["id"]] = None
    merger = merger_from_merge_list(tokens, model.get("merges", []), codec)
    config = read_tokenizer_config(path.parent)
    leading = _leading_special(spec.get("post_processor"))
    bos = leading if leading in special_tokens else config.get("bos_token")
    eos = config.get("eos_token")
    extra = stop_token_ids(path.parent, special_tokens)
    chat_template = chat_template_of(path.parent, config)
    tokenizer = ByteLevelBPETokenizer(
        merger=merger,
        pre_tokenizer=PreTokenizer.from_stages(pre_tokenizer_stages(spec.get("pre_tokenizer"))),
        token_bytes_by_id=token_bytes,
        special_tokens=special_tokens,
        special_ids=special_ids,
        bos_id=special_tokens.get(bos) if isinstance(bos, str) else None,
        eos_id=special_tokens.get(eos) if isinstance(eos, str) else None,
        extra_eos_ids=extra,
        chat_template=chat_template,
        add_bos=leading in special_tokens,
        suffix_ids=[special_tokens[name] for name in _trailing_specials(spec.get("post_processor")) if name in special_tokens],
        ignore_merges=bool(model.get("ignore_merges")),
        normalize=(lambda text: unicodedata.normalize("NFC", text)) if normalizer else None,
        strip_left=[entry["content"] for entry in added if entry.get("lstrip")],
        strip_right=[entry["content"] for entry in added if entry.get("rstrip")],
        name=f"tokenizer.json:{path.parent.name}",
    )
    return tokenizer


def _leading_special(post_processor: dict[str, Any] | None) -> str | None:
    """The special token a TemplateProcessing post-processor puts before a single text (the
    BOS that `add_special_tokens=True` adds, as Llama 3's tokenizer.json does), if any."""
    single = _single_template(post_processor)
    if single and "SpecialToken" in single[0]:
        return single[0]["SpecialToken"].get("id")
    return None


def _trailing_specials(post_processor: dict[str, Any] | None) -> list[str]:
    """The special tokens a TemplateProcessing post-processor puts after a single text (the EOS that embedding models
    such as Qwen3-Embedding pool at), in order."""
    single = _single_template(post_processor)
    ends = [i for i, piece in enumerate(single) if "Sequence" in piece]
    return [piece["SpecialToken"].get("id") for piece in single[ends[-1] + 1 :] if "SpecialToken" in piece] if ends else []


def _single_template(post_processor: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The `single` template of the first TemplateProcessing in a post-processor (inside a Sequence too); [] if none."""
    if not post_processor:
        return []
    if post_processor.get("type") == "Sequence":
        return next((found for part in post_processor.get("processors", []) if (found := _single_template(part))), [])
    return (post_processor.get("single") or []) if post_processor.get("type") == "TemplateProcessing" else []


def load_vocab_and_merges(folder: str | Path) -> ByteLevelBPETokenizer:
    """The byte-level BPE tokenizer of a folder with transformers' slow-tokenizer files, vocab.json (token -> id) and
    merges.txt (as OPT and many GPT-2-style folders ship, with no tokenizer.json): read as the tokenizer.json
    transformers would convert them to, its special tokens and BOS from tokenizer_config.json."""
    folder = Path(folder)
    vocab: dict[str, int] = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    lines = (folder / "merges.txt").read_text(encoding="utf-8").split("\n")
    merges = [line for line in lines if line and not line.startswith("#version")]
    config = read_tokenizer_config(folder)
    added = _added_tokens(config, vocab, folder)
    byte_level = {"type": "ByteLevel", "add_prefix_space": bool(config.get("add_prefix_space", False)), "trim_offsets": True,
                  "use_regex": True}  # fmt: skip
    spec = {"model": {"type": "BPE", "vocab": vocab, "merges": merges}, "pre_tokenizer": byte_level, "decoder": byte_level,
            "added_tokens": added, "post_processor": _bos_template(config) if config.get("add_bos_token") else None}  # fmt: skip
    return _byte_level_from_spec(spec, folder / "vocab.json")


def _added_tokens(config: dict[str, Any], vocab: dict[str, int], folder: Path) -> list[dict[str, Any]]:
    """tokenizer_config.json's added_tokens_decoder, else the special tokens it (or special_tokens_map.json) names."""
    listed = config.get("added_tokens_decoder")
    if isinstance(listed, dict):
        return [{**entry, "id": int(token_id)} for token_id, entry in listed.items()]
    names = dict(config)
    map_path = folder / "special_tokens_map.json"
    if map_path.is_file():
        names.update(json.loads(map_path.read_text(encoding="utf-8")))
    contents = {value.get("content") if isinstance(value, dict) else value
                for key, value in names.items() if key in ("bos_token", "eos_token", "unk_token", "pad_token")}  # fmt: skip
    return [{"content": text, "id": vocab[text], "special": True} for text in sorted(contents, key=str) if text in vocab]


def _bos_template(config: dict[str, Any]) -> dict[str, Any]:
    """The post-processor putting BOS before a text, as transformers' converter writes it for add_bos_token."""
    return {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": config.get("bos_token"), "type_id": 0}},
                                                      {"Sequence": {"id": "A", "type_id": 0}}]}  # fmt: skip


def load_gpt2_folder(folder: str | Path) -> ByteLevelBPETokenizer:
    """GPT-2's tokenizer from a folder with `encoder.json` (token -> id) and `vocab.bpe`
    (merges in priority order, after a "#version" line)."""
    folder = Path(folder)
    encoder: dict[str, int] = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
    lines = (folder / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [line for line in lines if line and not line.startswith("#version")]
    size = max(encoder.values()) + 1
    tokens = [""] * size
    for token, token_id in encoder.items():
        tokens[token_id] = token
    codec = ByteLevelCodec()
    special_tokens = (
        {"<|endoftext|>": encoder["<|endoftext|>"]} if "<|endoftext|>" in encoder else {}
    )
    token_bytes: list[bytes | None] = [
        None if token in special_tokens else codec.to_bytes(token) for token in tokens
    ]
    eos = special_tokens.get("<|endoftext|>")
    return ByteLevelBPETokenizer(
        merger=merger_from_merge_list(tokens, merges, codec),
        pre_tokenizer=PreTokenizer.named("gpt2"),
        token_bytes_by_id=token_bytes,
        special_tokens=special_tokens,
        bos_id=eos,
        eos_id=eos,
        name=f"gpt2:{folder.name}",
    )
