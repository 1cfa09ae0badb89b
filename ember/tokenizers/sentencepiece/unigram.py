"""Unigram language-model tokenization (Kudo 2018), as sentencepiece does it.

Every segmentation of a text into vocabulary pieces has the log-probability sum of its
pieces' scores; encoding takes the best one (Viterbi), and subword regularization samples
one with probability proportional to exp(alpha * score), either from the whole lattice
(forward-filtering, backward-sampling) or from the n best. Characters that no piece covers
get an unknown node scored min_score - 10, and runs of them fuse into one unknown token.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections.abc import Sequence
from typing import NamedTuple

from ember.tokenizers.sentencepiece.vocab import SentencePieceTokenizer
from ember.tokenizers.text.pieces import PieceKind

UNKNOWN_PENALTY = 10.0
_NOT_A_PREFIX = object()  # a sentinel (immutable): "no piece starts with this text"
# User-defined pieces always win: sentencepiece scores them length * max_score - 0.1.
USER_DEFINED_PENALTY = 0.1


class LatticeNode(NamedTuple):
    """One candidate piece in the lattice: text[start:end] as `token_id` (None: unknown).
    A NamedTuple: lattices create many of them, and tuples are the cheapest to build."""

    start: int
    end: int
    token_id: int | None
    score: float


class UnigramModel:
    """Pieces with log-probability scores, and the lattice algorithms over them."""

    def __init__(
        self,
        pieces: Sequence[str],
        scores: Sequence[float],
        kinds: Sequence[PieceKind] | None = None,
        float32_sums: bool = True,
    ) -> None:
        # Viterbi path scores summed in float32 (sentencepiece) or float64 (HF tokenizers): on equal-looking paths
        # the rounding of the sums decides, so each library's parity needs its arithmetic.
        self.float32_sums = float32_sums
        kinds = kinds if kinds is not None else [PieceKind.NORMAL] * len(pieces)
        normal_scores = [
            score for score, kind in zip(scores, kinds, strict=True) if kind == PieceKind.NORMAL
        ]
        self.min_score = min(normal_scores, default=0.0)
        self.max_score = max(normal_scores, default=0.0)
        self.unknown_score = self.min_score - UNKNOWN_PENALTY
        self._index: dict[str, tuple[int, float]] = {}
        for token_id, (piece, score, kind) in enumerate(zip(pieces, scores, kinds, strict=True)):
            if kind == PieceKind.NORMAL:
                self._index.setdefault(piece, (token_id, float(score)))
            elif kind == PieceKind.USER_DEFINED:
                bonus = len(piece) * self.max_score - USER_DEFINED_PENALTY
                self._index.setdefault(piece, (token_id, bonus))
        self.max_piece_length = max((len(piece) for piece in self._index), default=1)
        # Every piece and every proper prefix of one (value None): the lattice stops extending
        # a candidate as soon as it is no prefix of any piece, a trie walk with one dict.
        self._prefixes: dict[str, tuple[int, float] | None] = {}
        for piece in self._index:
            for end in range(1, len(piece)):
                self._prefixes.setdefault(piece[:end], None)
        self._prefixes.update(self._index)

    def lookup(self, piece: str) -> tuple[int, float] | None:
        """(id, score) of a piece that segmentations may use, None otherwise."""
        return self._index.get(piece)

    def lattice(self, text: str) -> list[list[LatticeNode]]:
        """Nodes grouped by start position; every position has at least one node."""
        prefixes = self._prefixes
        longest = self.max_piece_length
        size = len(text)
        starts: list[list[LatticeNode]] = []
        for start in range(size):
            nodes = []
            has_single = False
            for end in range(start + 1, min(size, start + longest) + 1):
                entry = prefixes.get(text[start:end], _NOT_A_PREFIX)
                if entry is _NOT_A_PREFIX:
                    break
                if entry is not None:
                    nodes.append(LatticeNode(start, end, entry[0], entry[1]))
                    has_single = has_single or end == start + 1
            if not has_single:
                nodes.append(LatticeNode(start, start + 1, None, self.unknown_score))
            starts.append(nodes)
        return starts

    def viterbi(self, text: str) -> list[LatticeNode]:
        """The best segmentation; on equal scores the path whose last piece starts earliest.

        Path scores are summed in float32 as sentencepiece does (float64 as HF tokenizers does, with
        `float32_sums` off): which of two equal-looking paths wins depends on the rounding of the
        sums, so parity needs the same arithmetic.
        """
        size = len(text)
        # Storing into a float32 array rounds like C's float; a float64 one keeps Python's sums.
        best = array("f" if self.float32_sums else "d", [-math.inf]) * (size + 1)
        rounded = array("f" if self.float32_sums else "d", [0.0])
        back: list[LatticeNode | None] = [None] * (size + 1)
        best[0] = 0.0
        for nodes in self.lattice(text):
            for node in nodes:
                rounded[0] = best[node.start] + node.score
                if back[node.end] is None or rounded[0] > best[node.end]:
                    best[node.end] = rounded[0]
                    back[node.end] = node
        return _backtrack(back, size)

    def log_marginal(self, text: str, alpha: float = 1.0) -> float:
        """log of the sum over all segmentations of exp(alpha * score): the normaliser of
        sampling, and (alpha=1) the text's log-likelihood under the model."""
        return self._forward(self.lattice(text), len(text), alpha)[-1]

    def _forward(self, starts: list[list[LatticeNode]], size: int, alpha: float) -> list[float]:
        forward = [-math.inf] * (size + 1)
        forward[0] = 0.0
        for nodes in starts:
            for node in nodes:
                forward[node.end] = _log_add(
                    forward[node.end], forward[node.start] + alpha * node.score
                )
        return forward

    def sample(self, text: str, alpha: float, rng: random.Random) -> list[LatticeNode]:
        """One segmentation drawn with probability exp(alpha * score) / Z (forward filtering,
        backward sampling)."""
        size = len(text)
        starts = self.lattice(text)
        forward = self._forward(starts, size, alpha)
        ending: list[list[LatticeNode]] = [[] for _ in range(size + 1)]
        for nodes in starts:
            for node in nodes:
                ending[node.end].append(node)
        path = []
        position = size
        while position > 0:
            nodes = ending[position]
            weights = [
                math.exp(forward[n.start] + alpha * n.score - forward[position]) for n in nodes
            ]
            node = rng.choices(nodes, weights=weights)[0]
            path.append(node)
            position = node.start
        return path[::-1]

    def nbest(self, text: str, count: int) -> list[tuple[list[LatticeNode], float]]:
        """The `count` best segmentations with their scores, best first."""
        size = len(text)
        # best[end] holds up to `count` (score, node, rank-in-best[start]) partial paths.
        best: list[list[tuple[float, LatticeNode | None, int]]] = [[] for _ in range(size + 1)]
        best[0] = [(0.0, None, 0)]
        ending: list[list[LatticeNode]] = [[] for _ in range(size + 1)]
        for nodes in self.lattice(text):
            for node in nodes:
                ending[node.end].append(node)
        for end in range(1, size + 1):
            candidates = [
                (score + node.score, node, rank)
                for node in ending[end]
                for rank, (score, _, _) in enumerate(best[node.start])
            ]
            best[end] = heapq.nlargest(count, candidates, key=lambda item: item[0])
        results = []
        for score, node, rank in best[size]:
            path = []
            while node is not None:
                path.append(node)
                _, node, rank = best[node.start][rank]
            results.append((path[::-1], score))
        return results


def _backtrack(back: list[LatticeNode | None], size: int) -> list[LatticeNode]:
    path = []
    position = size
    while position > 0:
        node = back[position]
        if node is None:
            raise AssertionError("lattice has a gap: every position should have a node")
        path.append(node)
        position = node.start
    return path[::-1]


def _log_add(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    if b == -math.inf:
        return a
    return a + math.log1p(math.exp(b - a))


class UnigramTokenizer(SentencePieceTokenizer):
    """A sentencepiece-compatible Unigram vocabulary (Viterbi encoding, sampling)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model = UnigramModel(self._pieces, self._scores, self._kinds)

    def _segment(self, normalized: str) -> list[int]:
        return self._path_to_ids(normalized, self.model.viterbi(normalized))

    def _path_to_ids(self, normalized: str, path: list[LatticeNode]) -> list[int]:
        ids: list[int] = []
        unknown_start = None
        for node in [*path, None]:
            if node is not None and node.token_id is None:
                if unknown_start is None:
                    unknown_start = node.start
                continue
            if unknown_start is not None:  # a run of unknown characters ends here
                end = node.start if node is not None else len(normalized)
                ids.extend(self._spell_unknown(normalized[unknown_start:end]))
                unknown_start = None
            if node is not None:
                ids.append(node.token_id)
        return ids

    def sample_encode(
        self,
        text: str,
        alpha: float = 0.1,
        nbest_size: int = -1,
        rng: random.Random | None = None,
    ) -> list[int]:
        """A sampled segmentation (subword regularization), sentencepiece's semantics:
        nbest_size < 0 samples from the whole lattice, nbest_size > 1 from the n best
        (weights exp(alpha * score)), 0 or 1 returns the best segmentation."""
        rng = rng or random.Random()
        normalized = self.normalize(text)
        if not normalized:
            return []
        if nbest_size in (0, 1):
            return self._segment(normalized)
        if nbest_size < 0:
            return self._path_to_ids(normalized, self.model.sample(normalized, alpha, rng))
        candidates = self.model.nbest(normalized, nbest_size)
        top = max(score for _, score in candidates)
        weights = [math.exp(alpha * (score - top)) for _, score in candidates]
        path = rng.choices([path for path, _ in candidates], weights=weights)[0]
        return self._path_to_ids(normalized, path)

    def nbest_encode(self, text: str, count: int) -> list[list[int]]:
        """The `count` best segmentations of `text` as id lists, best first."""
        normalized = self.normalize(text)
        if not normalized:
            return [[]]
        return [
            self._path_to_ids(normalized, path) for path, _ in self.model.nbest(normalized, count)
        ]

    def log_likelihood(self, text: str) -> float:
        """log P(text) under the model, summed over all segmentations."""
        normalized = self.normalize(text)
        return self.model.log_marginal(normalized) if normalized else 0.0
