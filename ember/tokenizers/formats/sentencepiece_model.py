"""SentencePiece `.model` files (a serialized `ModelProto`): read, write, and turn into tokenizers.

Field numbers follow sentencepiece_model.proto: ModelProto{1: pieces, 2: trainer_spec,
3: normalizer_spec, 5: denormalizer_spec}; SentencePiece{1: piece, 2: score, 3: type};
TrainerSpec{3: model_type, 4: vocab_size, 35: byte_fallback, 40..43: unk/bos/eos/pad id};
NormalizerSpec{1: name, 2: precompiled_charsmap, 3: add_dummy_prefix,
4: remove_extra_whitespaces, 5: escape_whitespaces}. Fields ember does not interpret are kept
as raw bytes, so a model read and written back keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ember.tokenizers.base import Tokenizer
from ember.tokenizers.formats import protobuf_wire as wire
from ember.tokenizers.text.pieces import PieceKind
from ember.tokenizers.text.sentencepiece_normalizer import CharsMap

_SPECIAL_KINDS = (PieceKind.CONTROL, PieceKind.USER_DEFINED)  # pieces that can be a chat format's end-of-turn token

MODEL_UNIGRAM, MODEL_BPE, MODEL_WORD, MODEL_CHAR = 1, 2, 3, 4


@dataclass
class SentencePieceEntry:
    """One vocabulary entry: its text (spaces as `▁`), score, and kind."""

    piece: str
    score: float = 0.0
    kind: PieceKind = PieceKind.NORMAL


@dataclass
class NormalizerSpec:
    """How text is normalised before encoding: compiled rules (see text/sentencepiece_normalizer.py) and
    whitespace options."""

    name: str = "identity"
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    extra_fields: bytes = b""  # fields ember does not interpret, re-emitted verbatim


@dataclass
class TrainerSpec:
    """The training settings stored in the model; ember reads the ones encoding needs."""

    model_type: int = MODEL_UNIGRAM
    vocab_size: int = 8000
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    unk_surface: str = " \u2047 "  # field 44: what decoding prints for the unknown piece
    extra_fields: bytes = b""


@dataclass
class SentencePieceModel:
    """A parsed `.model` file."""

    pieces: list[SentencePieceEntry] = field(default_factory=list)
    trainer: TrainerSpec = field(default_factory=TrainerSpec)
    normalizer: NormalizerSpec = field(default_factory=NormalizerSpec)
    denormalizer: bytes | None = None  # kept raw: ember does not denormalise

    # --- reading ------------------------------------------------------------------------

    @classmethod
    def from_bytes(cls, data: bytes) -> SentencePieceModel:
        model = cls()
        for number, _, value in wire.iter_fields(data):
            if number == 1:
                model.pieces.append(_read_piece(value))
            elif number == 2:
                model.trainer = _read_trainer(value)
            elif number == 3:
                model.normalizer = _read_normalizer(value)
            elif number == 5:
                model.denormalizer = value
        if not model.pieces:
            raise ValueError("not a SentencePiece model: it has no pieces")
        return model

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceModel:
        try:
            return cls.from_bytes(Path(path).read_bytes())
        except (ValueError, IndexError) as error:
            raise ValueError(
                f"{path}: not a readable SentencePiece .model file: {error}"
            ) from error

    # --- writing ------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        out = bytearray()
        for entry in self.pieces:
            body = wire.field_bytes(1, entry.piece) + wire.field_float(2, entry.score)
            if entry.kind != PieceKind.NORMAL:
                body += wire.field_varint(3, int(entry.kind))
            out += wire.field_bytes(1, body)
        out += wire.field_bytes(2, _write_trainer(self.trainer))
        out += wire.field_bytes(3, _write_normalizer(self.normalizer))
        if self.denormalizer is not None:
            out += wire.field_bytes(5, self.denormalizer)
        return bytes(out)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())


def _read_piece(data: bytes) -> SentencePieceEntry:
    entry = SentencePieceEntry("")
    for number, _, value in wire.iter_fields(data):
        if number == 1:
            entry.piece = value.decode("utf-8")
        elif number == 2:
            entry.score = wire.as_float(value)
        elif number == 3:
            entry.kind = PieceKind(value)
    return entry


_TRAINER_INTS = {
    3: "model_type",
    4: "vocab_size",
    40: "unk_id",
    41: "bos_id",
    42: "eos_id",
    43: "pad_id",
}


def _read_trainer(data: bytes) -> TrainerSpec:
    spec = TrainerSpec()
    extra = bytearray()
    for number, wire_type, value in wire.iter_fields(data):
        if number in _TRAINER_INTS and wire_type == wire.VARINT:
            setattr(spec, _TRAINER_INTS[number], wire.as_signed(value))
        elif number == 35 and wire_type == wire.VARINT:
            spec.byte_fallback = bool(value)
        elif number == 44 and wire_type == wire.LENGTH_DELIMITED:
            spec.unk_surface = value.decode("utf-8")
        else:
            extra += _reencode(number, wire_type, value)
    spec.extra_fields = bytes(extra)
    return spec


def _write_trainer(spec: TrainerSpec) -> bytes:
    out = bytearray()
    for number, name in _TRAINER_INTS.items():
        out += wire.field_varint(number, getattr(spec, name))
    out += wire.field_varint(35, spec.byte_fallback)
    out += wire.field_bytes(44, spec.unk_surface)
    return bytes(out) + spec.extra_fields


def _read_normalizer(data: bytes) -> NormalizerSpec:
    spec = NormalizerSpec(name="")
    extra = bytearray()
    for number, wire_type, value in wire.iter_fields(data):
        if number == 1:
            spec.name = value.decode("utf-8")
        elif number == 2:
            spec.precompiled_charsmap = value
        elif number == 3:
            spec.add_dummy_prefix = bool(value)
        elif number == 4:
            spec.remove_extra_whitespaces = bool(value)
        elif number == 5:
            spec.escape_whitespaces = bool(value)
        else:
            extra += _reencode(number, wire_type, value)
    spec.extra_fields = bytes(extra)
    return spec


def _write_normalizer(spec: NormalizerSpec) -> bytes:
    return (
        wire.field_bytes(1, spec.name)
        + wire.field_bytes(2, spec.precompiled_charsmap)
        + wire.field_varint(3, spec.add_dummy_prefix)
        + wire.field_varint(4, spec.remove_extra_whitespaces)
        + wire.field_varint(5, spec.escape_whitespaces)
        + spec.extra_fields
    )


def _reencode(number: int, wire_type: int, value: int | bytes) -> bytes:
    if wire_type == wire.VARINT:
        return wire.field_varint(number, value)
    if wire_type == wire.LENGTH_DELIMITED:
        return wire.field_bytes(number, value)
    key = wire.encode_varint(number << 3 | wire_type)
    size = 4 if wire_type == wire.FIXED32 else 8
    return key + int(value).to_bytes(size, "little")


def looks_like_sentencepiece_model(head: bytes) -> bool:
    """Whether a file starts like a serialized ModelProto (field 1, a piece message)."""
    if len(head) < 4 or head[0] != 0x0A:  # field 1, length-delimited
        return False
    try:
        length, offset = wire.read_varint(head, 1)
        if offset + 2 > len(head):
            return False
        return head[offset] == 0x0A  # the piece message starts with its field 1 (text)
    except ValueError:
        return False


def tokenizer_from_model(model: SentencePieceModel, name: str = "sentencepiece", chat_template: str | None = None,
                         extra_eos_ids: Iterable[int] = ()) -> Tokenizer:
    """The ember tokenizer for a parsed SentencePiece model (BPE or Unigram); `chat_template` and `extra_eos_ids` (ids
    beyond EOS that end generation) come from where it lies."""
    from ember.tokenizers.sentencepiece.bpe import SentencePieceBPETokenizer, SentencePieceOptions
    from ember.tokenizers.sentencepiece.unigram import UnigramTokenizer

    normalizer = model.normalizer
    charsmap = (
        CharsMap(normalizer.precompiled_charsmap) if normalizer.precompiled_charsmap else None
    )
    trainer = model.trainer

    def valid(token_id: int) -> int | None:
        return token_id if 0 <= token_id < len(model.pieces) else None

    common = {
        "pieces": [entry.piece for entry in model.pieces],
        "scores": [entry.score for entry in model.pieces],
        "kinds": [entry.kind for entry in model.pieces],
        "bos_id": valid(trainer.bos_id),
        "eos_id": valid(trainer.eos_id),
        "unk_id": valid(trainer.unk_id),
        "name": name,
        "chat_template": chat_template,
        "extra_eos_ids": extra_eos_ids,
    }
    options = SentencePieceOptions(
        add_dummy_prefix=normalizer.add_dummy_prefix,
        remove_extra_whitespaces=normalizer.remove_extra_whitespaces,
        space_marker="\u2581" if normalizer.escape_whitespaces else " ",
        byte_fallback=trainer.byte_fallback,
        unknown_surface=trainer.unk_surface,
        charsmap=charsmap,
        user_defined_after_normalizing=True,
    )
    if trainer.model_type == MODEL_BPE:
        return SentencePieceBPETokenizer(options=options, **common)
    if trainer.model_type == MODEL_UNIGRAM:
        return UnigramTokenizer(options=options, **common)
    raise ValueError(
        f"{name}: SentencePiece model type {trainer.model_type} is not supported "
        "(ember reads BPE = 2 and Unigram = 1)"
    )


def load_sentencepiece_model(path: str | Path) -> Tokenizer:
    """The tokenizer of a SentencePiece `.model` file, with the chat template and stop tokens of the HF folder it
    lies in, if it does (`formats.hf.folder`)."""
    from ember.tokenizers.formats.hf.folder import (
        chat_template_of,
        read_tokenizer_config,
        stop_token_ids,
    )

    model, folder = SentencePieceModel.load(path), Path(path).parent
    specials = {entry.piece: token_id for token_id, entry in enumerate(model.pieces) if entry.kind in _SPECIAL_KINDS}
    return tokenizer_from_model(model, name=f"spm:{Path(path).name}", chat_template=chat_template_of(folder, read_tokenizer_config(folder)),
                                extra_eos_ids=stop_token_ids(folder, specials))
