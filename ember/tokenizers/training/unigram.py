"""Unigram LM training by EM with pruning, following sentencepiece's trainer.

1. Normalise each sentence (identity rules: extra spaces removed, dummy prefix, ` ` -> `▁`),
   keep the characters that cover `character_coverage` of all characters (the rest become
   unknown), and split sentences into words at `▁` (pieces never cross a word start, so
   working on distinct words with their counts equals working on sentences).
2. Seed vocabulary: every character (scored by its count) plus the most frequent valid
   substrings that occur at least twice and are followed by more than one distinct
   character (the branching substrings a suffix array enumerates), scored count * length;
   the top `seed_size`, scores normalised to log-probabilities.
3. Repeat: `sub_iterations` EM steps (E: expected piece counts by forward-backward over each
   word's lattice; M: drop pieces expected fewer than 0.5 times, score = digamma(count) -
   digamma(total), the Bayesian EM sentencepiece uses); stop when the vocabulary is within
   1.1x the target; else prune: a piece whose removal least lowers the likelihood (its
   Viterbi frequency re-assigned to its second-best segmentation) goes first, down to
   max(1.1 x target, shrinking_factor x size).
4. Final vocabulary: every required character, then the best-scored pieces, up to the size.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ember.tokenizers.formats.sentencepiece_model import (
    MODEL_UNIGRAM,
    NormalizerSpec,
    SentencePieceEntry,
    SentencePieceModel,
    TrainerSpec,
)
from ember.tokenizers.sentencepiece.unigram import UnigramModel
from ember.tokenizers.text.pieces import PieceKind

SPACE_MARKER = "\u2581"
_WORD_START = re.compile(f"(?={SPACE_MARKER})")
EXPECTED_FREQUENCY_THRESHOLD = 0.5
REQUIRED_CHAR_SCORE_STEP = 0.0001


@dataclass(frozen=True)
class UnigramTrainerOptions:
    """Training settings; names and defaults follow sentencepiece's TrainerSpec."""

    vocab_size: int = 8000
    character_coverage: float = 0.9995
    seed_size: int = 1_000_000
    shrinking_factor: float = 0.75
    sub_iterations: int = 2
    max_piece_length: int = 16
    split_by_number: bool = True
    split_by_unicode_script: bool = True
    max_sentence_length: int = 4192
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    meta_pieces: tuple[tuple[str, PieceKind], ...] = (
        ("<unk>", PieceKind.UNKNOWN),
        ("<s>", PieceKind.CONTROL),
        ("</s>", PieceKind.CONTROL),
    )


def digamma(x: float) -> float:
    """The digamma function: recurrence up to x >= 7, then the asymptotic series."""
    result = 0.0
    while x < 7:
        result -= 1 / x
        x += 1
    x -= 0.5
    inverse = 1 / x
    inverse2 = inverse * inverse
    inverse4 = inverse2 * inverse2
    return (
        result
        + math.log(x)
        + inverse2 / 24
        - 7 * inverse4 / 960
        + 31 * inverse4 * inverse2 / 8064
        - 127 * inverse4 * inverse4 / 30720
    )


def _script(char: str) -> str:
    """A coarse Unicode script of a character: what may not be mixed inside one piece."""
    if "0" <= char <= "9":
        return "NUMBER"
    category = unicodedata.category(char)
    if category[0] not in "LM":
        return "COMMON"
    name = unicodedata.name(char, "")
    first = name.split(" ")[0] if name else "UNKNOWN"
    if first in ("CJK", "HIRAGANA", "KATAKANA") or char == "\u30fc":
        return "HAN"
    return first


class UnigramTrainer:
    """Trains a sentencepiece-compatible Unigram model (see module doc)."""

    def __init__(self, options: UnigramTrainerOptions) -> None:
        self.options = options
        self._scripts: dict[str, str] = {}

    # --- corpus -----------------------------------------------------------------------------

    def normalize(self, sentence: str) -> str:
        options = self.options
        if options.remove_extra_whitespaces:
            sentence = " ".join(part for part in sentence.split(" ") if part)
        if not sentence:
            return ""
        if options.add_dummy_prefix:
            sentence = " " + sentence
        sentence = sentence.replace(" ", SPACE_MARKER)
        return sentence.rstrip(SPACE_MARKER) if options.remove_extra_whitespaces else sentence

    def _words(self, sentences: Iterable[str]) -> tuple[Counter[str], list[list[str]]]:
        words: Counter[str] = Counter()
        sentence_words: list[list[str]] = []
        for raw in sentences:
            sentence = self.normalize(raw.rstrip("\n"))
            if not sentence or len(sentence.encode()) > self.options.max_sentence_length:
                continue
            # A word starts at every marker: pieces may hold a marker only in front.
            split = [word for word in _WORD_START.split(sentence) if word]
            words.update(split)
            sentence_words.append(split)
        return words, sentence_words

    def _required_chars(self, words: Counter[str]) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for word, count in words.items():
            for char in word:
                counts[char] += count
        total = sum(counts.values())
        kept: dict[str, int] = {}
        covered = 0
        for char, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            if covered / max(total, 1) >= self.options.character_coverage:
                break
            kept[char] = count
            covered += count
        return kept

    def _is_valid_piece(self, piece: str, required: dict[str, int]) -> bool:
        if len(piece) > self.options.max_piece_length:
            return False
        previous = None
        for position, char in enumerate(piece):
            if char not in required:
                return False
            if char == SPACE_MARKER:
                if position > 0:
                    return False
                continue
            script = self._scripts.get(char)
            if script is None:
                script = self._scripts[char] = _script(char)
            if script == "NUMBER" and not self.options.split_by_number:
                script = "COMMON"
            if (
                previous is not None
                and script != previous
                and (self.options.split_by_unicode_script or "NUMBER" in (script, previous))
            ):
                return False
            previous = script
        return True

    # --- seeds ------------------------------------------------------------------------------

    def _seed_pieces(self, words: Counter[str], required: dict[str, int]) -> dict[str, float]:
        counts: Counter[str] = Counter()
        followers: dict[str, set[str]] = defaultdict(set)
        longest = self.options.max_piece_length
        for word, count in words.items():
            size = len(word)
            for start in range(size):
                for end in range(start + 2, min(size, start + longest) + 1):
                    piece = word[start:end]
                    counts[piece] += count
                    followers[piece].add(word[end] if end < size else SPACE_MARKER)
        candidates = [
            (count * len(piece), piece)
            for piece, count in counts.items()
            if count > 1 and len(followers[piece]) > 1 and self._is_valid_piece(piece, required)
        ]
        candidates.sort(key=lambda item: (-item[0], item[1]))
        seeds: dict[str, float] = {char: float(count) for char, count in required.items()}
        for score, piece in candidates:
            if len(seeds) >= self.options.seed_size:
                break
            seeds[piece] = float(score)
        total = math.log(sum(seeds.values()))
        return {piece: math.log(score) - total for piece, score in seeds.items()}

    # --- EM ---------------------------------------------------------------------------------

    @staticmethod
    def _model(pieces: dict[str, float]) -> tuple[UnigramModel, list[str]]:
        names = list(pieces)
        return UnigramModel(names, [pieces[name] for name in names]), names

    def _e_step(
        self, pieces: dict[str, float], words: Counter[str]
    ) -> tuple[list[float], list[str], float]:
        model, names = self._model(pieces)
        expected = [0.0] * len(names)
        log_likelihood = 0.0
        for word, count in words.items():
            starts = model.lattice(word)
            size = len(word)
            forward = model._forward(starts, size, 1.0)
            backward = [-math.inf] * (size + 1)
            backward[size] = 0.0
            for nodes in reversed(starts):
                for node in nodes:
                    value = node.score + backward[node.end]
                    current = backward[node.start]
                    if value > current:
                        current, value = value, current
                    backward[node.start] = (
                        current
                        if value == -math.inf
                        else current + math.log1p(math.exp(value - current))
                    )
            total = forward[size]
            log_likelihood += count * total
            for nodes in starts:
                for node in nodes:
                    if node.token_id is not None:
                        expected[node.token_id] += count * math.exp(
                            forward[node.start] + node.score + backward[node.end] - total
                        )
        return expected, names, log_likelihood

    @staticmethod
    def _m_step(expected: list[float], names: list[str]) -> dict[str, float]:
        kept = [
            (name, frequency)
            for name, frequency in zip(names, expected, strict=True)
            if frequency >= EXPECTED_FREQUENCY_THRESHOLD
        ]
        log_total = digamma(sum(frequency for _, frequency in kept))
        return {name: digamma(frequency) - log_total for name, frequency in kept}

    def _prune(
        self,
        pieces: dict[str, float],
        words: Counter[str],
        word_sentences: dict[str, list[int]],
        sentence_count: int,
        desired: int,
    ) -> dict[str, float]:
        model, names = self._model(pieces)
        always_keep = [True] * len(names)
        alternatives: list[list[int]] = [[] for _ in names]
        for token_id, name in enumerate(names):
            best = model.nbest(name, 2)
            if len(best) == 1:
                continue
            if len(best[0][0]) >= 2:
                always_keep[token_id] = False  # the piece is not its own best segmentation
            elif len(best[0][0]) == 1:
                alternatives[token_id] = [
                    node.token_id for node in best[1][0] if node.token_id is not None
                ]
        frequency = [0.0] * len(names)
        sentences_with: list[set[int]] = [set() for _ in names]
        for word, count in words.items():
            for node in model.viterbi(word):
                if node.token_id is not None:
                    frequency[node.token_id] += count
                    sentences_with[node.token_id].update(word_sentences[word])
        total = sum(frequency)
        log_total = math.log(total)
        kept: dict[str, float] = {}
        candidates: list[tuple[float, str]] = []
        for token_id, name in enumerate(names):
            if frequency[token_id] == 0 or not always_keep[token_id]:
                continue
            if not alternatives[token_id]:
                kept[name] = pieces[name]
                continue
            share = len(sentences_with[token_id]) / sentence_count
            log_prob = math.log(frequency[token_id]) - log_total
            log_total_alternative = math.log(
                total + frequency[token_id] * (len(alternatives[token_id]) - 1)
            )
            log_prob_alternative = sum(
                math.log(frequency[other] + frequency[token_id]) - log_total_alternative
                for other in alternatives[token_id]
            )
            candidates.append((share * (log_prob - log_prob_alternative), name))
        target = max(desired, int(self.options.shrinking_factor * len(pieces)))
        for _, name in sorted(candidates, key=lambda item: (-item[0], item[1])):
            if len(kept) >= target:
                break
            kept[name] = pieces[name]
        return kept

    # --- the whole run ----------------------------------------------------------------------

    def train(self, sentences: Iterable[str]) -> SentencePieceModel:
        """A trained model, ready to save as a sentencepiece `.model` file."""
        options = self.options
        words, sentence_words = self._words(sentences)
        if not words:
            raise ValueError("the training corpus has no text")
        word_sentences: dict[str, list[int]] = defaultdict(list)
        for index, split in enumerate(sentence_words):
            for word in set(split):
                word_sentences[word].append(index)
        required = self._required_chars(words)
        pieces = self._seed_pieces(words, required)
        target = options.vocab_size - len(options.meta_pieces)
        desired = int(options.vocab_size * 1.1)
        self.log_likelihoods: list[float] = []
        while True:
            for _ in range(options.sub_iterations):
                expected, names, log_likelihood = self._e_step(pieces, words)
                self.log_likelihoods.append(log_likelihood)
                pieces = self._m_step(expected, names)
            if len(pieces) <= desired:
                break
            pieces = self._prune(pieces, words, word_sentences, len(sentence_words), desired)
        return self._finalize(pieces, required, target)

    def _finalize(
        self, pieces: dict[str, float], required: dict[str, int], target: int
    ) -> SentencePieceModel:
        final: dict[str, float] = {}
        penalty = min(pieces.values(), default=0.0)
        for char in sorted(required, key=lambda c: (-required[c], c)):
            if char in pieces:
                final[char] = pieces[char]
            else:
                penalty -= REQUIRED_CHAR_SCORE_STEP
                final[char] = penalty
        for name, score in sorted(pieces.items(), key=lambda item: (-item[1], item[0])):
            if len(final) >= target:
                break
            final.setdefault(name, score)
        ordered = sorted(final.items(), key=lambda item: (-item[1], item[0]))
        entries = [SentencePieceEntry(text, 0.0, kind) for text, kind in self.options.meta_pieces]
        entries += [SentencePieceEntry(text, score) for text, score in ordered]
        kinds = [kind for _, kind in self.options.meta_pieces]
        trainer = TrainerSpec(
            model_type=MODEL_UNIGRAM,
            vocab_size=len(entries),
            unk_id=kinds.index(PieceKind.UNKNOWN) if PieceKind.UNKNOWN in kinds else -1,
            bos_id=1 if len(kinds) > 1 else -1,
            eos_id=2 if len(kinds) > 2 else -1,
        )
        normalizer = NormalizerSpec(
            name="identity",
            add_dummy_prefix=self.options.add_dummy_prefix,
            remove_extra_whitespaces=self.options.remove_extra_whitespaces,
        )
        return SentencePieceModel(entries, trainer, normalizer)


def train_unigram(sentences: Iterable[str], vocab_size: int, **settings) -> SentencePieceModel:
    """Trains a Unigram model of `vocab_size` pieces (see UnigramTrainerOptions)."""
    return UnigramTrainer(UnigramTrainerOptions(vocab_size=vocab_size, **settings)).train(sentences)
