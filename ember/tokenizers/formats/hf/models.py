"""HF tokenizer.json models for the general pipeline: WordPiece, BPE over symbols, Unigram.

Each turns one pre-tokenized word into ids, as the `tokenizers` library does:
- WordPiece: greedy longest match from the left, later pieces spelled with the continuing
  prefix ("##"); a word with any unmatched part, or longer than max_input_chars_per_word
  characters, is the unknown token.
- BPE: the word's characters (prefix/suffix applied) are symbols; a character outside the
  vocabulary becomes its `<0xNN>` byte tokens with byte_fallback, else the unknown token
  (consecutive ones fused with fuse_unk), else it is dropped; then merges by rank.
- Unigram: the best segmentation by score, unknown characters fused into one unknown token
  (or spelled as byte tokens with byte_fallback).
"""

from __future__ import annotations

from typing import Any

from ember.tokenizers.bpe.merges import MAX_VOCAB, BytePairMerger, pair_key, pair_value
from ember.tokenizers.sentencepiece.unigram import UnigramModel
from ember.tokenizers.text.piece_cache import PieceCache


class WordPieceModel:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.vocab: dict[str, int] = dict(spec["vocab"])
        self.unk_id = self.vocab[spec.get("unk_token", "[UNK]")]
        self.prefix = spec.get("continuing_subword_prefix", "##")
        self.max_chars = spec.get("max_input_chars_per_word", 100)
        self._cache: PieceCache[list[int]] = PieceCache()

    def tokenize(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._greedy(word)
            self._cache.remember(word, ids)
        return ids

    def _greedy(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk_id]
        vocab, ids, start = self.vocab, [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                token_id = vocab.get(piece)
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                return [self.unk_id]
        return ids


class SymbolBPEModel:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.vocab: dict[str, int] = dict(spec["vocab"])
        if len(self.vocab) > MAX_VOCAB:
            raise ValueError(f"vocabulary of {len(self.vocab)} tokens exceeds {MAX_VOCAB}")
        unk = spec.get("unk_token")
        self.unk_id = None if unk is None else self.vocab.get(unk)
        self.fuse_unk = bool(spec.get("fuse_unk"))
        self.byte_fallback = bool(spec.get("byte_fallback"))
        self.prefix = spec.get("continuing_subword_prefix") or ""
        self.suffix = spec.get("end_of_word_suffix") or ""
        self.ignore_merges = bool(spec.get("ignore_merges"))
        table: dict[int, int] = {}
        for rank, merge in enumerate(spec.get("merges", [])):
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            merged = (
                left + right[len(self.prefix) :]
                if self.prefix and right.startswith(self.prefix)
                else left + right
            )
            ids = self.vocab.get(left), self.vocab.get(right), self.vocab.get(merged)
            if None not in ids and pair_key(ids[0], ids[1]) not in table:
                table[pair_key(ids[0], ids[1])] = pair_value(rank, ids[2])
        self._merger = BytePairMerger([None] * 256, table, use_native=False)
        self._byte_ids = [self.vocab.get(f"<0x{byte:02X}>") for byte in range(256)]
        self._cache: PieceCache[list[int]] = PieceCache()

    def tokenize(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._tokenize(word)
            self._cache.remember(word, ids)
        return ids

    def _tokenize(self, word: str) -> list[int]:
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        symbols: list[int] = []
        previous_unknown = False
        last = len(word) - 1
        for index, char in enumerate(word):
            text = (
                (self.prefix if index > 0 else "") + char + (self.suffix if index == last else "")
            )
            token_id = self.vocab.get(text)
            if token_id is not None:
                symbols.append(token_id)
                previous_unknown = False
                continue
            if self.byte_fallback:
                spelled = [self._byte_ids[byte] for byte in char.encode()]
                if None not in spelled:
                    symbols.extend(spelled)
                    previous_unknown = False
                    continue
            if self.unk_id is not None:
                if not (self.fuse_unk and previous_unknown):
                    symbols.append(self.unk_id)
                previous_unknown = True
        return self._merger.merge_ids(symbols)


class UnigramJSONModel:
    def __init__(self, spec: dict[str, Any]) -> None:
        entries = spec["vocab"]
        self.vocab = {piece: token_id for token_id, (piece, _) in enumerate(entries)}
        self.unk_id = spec.get("unk_id")
        self.byte_fallback = bool(spec.get("byte_fallback"))
        self._model = UnigramModel([piece for piece, _ in entries], [score for _, score in entries], float32_sums=False)
        self._byte_ids = [self.vocab.get(f"<0x{byte:02X}>") for byte in range(256)]
        self._cache: PieceCache[list[int]] = PieceCache()

    def tokenize(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._tokenize(word)
            self._cache.remember(word, ids)
        return ids

    def _tokenize(self, word: str) -> list[int]:
        if not word:
            return []
        ids: list[int] = []
        previous_unknown = False
        for node in self._model.viterbi(word):
            if node.token_id is not None:
                ids.append(node.token_id)
                previous_unknown = False
                continue
            text = word[node.start : node.end]
            spelled = (
                [self._byte_ids[byte] for byte in text.encode()] if self.byte_fallback else [None]
            )
            if None not in spelled:
                ids.extend(spelled)
            elif self.unk_id is not None and not previous_unknown:
                ids.append(self.unk_id)
            previous_unknown = None in spelled
        return ids


def build_model(spec: dict[str, Any]):
    kind = spec.get("type")
    if kind == "WordPiece":
        return WordPieceModel(spec)
    if kind == "BPE":
        return SymbolBPEModel(spec)
    if kind == "Unigram":
        return UnigramJSONModel(spec)
    raise ValueError(f"tokenizer.json model type {kind!r} is not supported by ember.tokenizers")
