"""Unigram: Viterbi encoding against sentencepiece, .model save/load, EM training against
sentencepiece's trainer (stated tolerances), and sampling frequencies (a chi-square test)."""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import combinations

import pytest
from tok_corpus import build_corpus

from ember.tokenizers import load
from ember.tokenizers.formats.sentencepiece_model import SentencePieceModel
from ember.tokenizers.sentencepiece.unigram import UnigramTokenizer
from ember.tokenizers.training.unigram import digamma, train_unigram

VOCAB_SIZE = 1000
# Tolerances of ember's trainer against sentencepiece's, both on botchan.txt, vocab 1000,
# identity normalisation, all other settings default.
MIN_VOCAB_OVERLAP = 0.85  # share of sentencepiece's pieces that ember's vocabulary also has
MAX_TOKEN_COUNT_GAP = 0.02  # relative difference of tokens needed for the whole corpus
MAX_LOG_LIKELIHOOD_GAP = 0.01  # relative difference of corpus log-likelihood


@pytest.fixture(scope="module")
def spm():
    return pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def botchan_lines(shared_dir):
    return (shared_dir / "corpus" / "botchan.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def reference_model_path(spm, shared_dir, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("spm") / "botchan_unigram"
    spm.SentencePieceTrainer.train(
        input=str(shared_dir / "corpus" / "botchan.txt"),
        model_prefix=str(prefix),
        vocab_size=VOCAB_SIZE,
        model_type="unigram",
        normalization_rule_name="identity",
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def ember_model_path(botchan_lines, tmp_path_factory):
    path = tmp_path_factory.mktemp("ember") / "botchan_unigram.model"
    train_unigram(botchan_lines, VOCAB_SIZE).save(path)
    return path


def test_viterbi_matches_sentencepiece_on_its_own_model(
    spm, shared_dir, reference_model_path, botchan_lines
):
    reference = spm.SentencePieceProcessor(model_file=str(reference_model_path))
    ours = load(reference_model_path)
    assert isinstance(ours, UnigramTokenizer)
    samples = botchan_lines + build_corpus(shared_dir, count=2000, seed=20)
    mismatches = [
        text[:60]
        for text in samples
        if ours.encode(text, allowed_special=()) != reference.encode(text)
    ]
    assert mismatches == []
    for text in samples[:200]:
        assert ours.decode(ours.encode(text, allowed_special=())) == reference.decode(
            reference.encode(text)
        )


def test_saved_model_round_trips_and_sentencepiece_reads_it(spm, ember_model_path, botchan_lines):
    model = SentencePieceModel.load(ember_model_path)
    assert SentencePieceModel.from_bytes(model.to_bytes()) == model
    reference = spm.SentencePieceProcessor(model_file=str(ember_model_path))
    ours = load(ember_model_path)
    assert reference.get_piece_size() == ours.vocab_size == VOCAB_SIZE
    for text in botchan_lines:
        assert ours.encode(text, allowed_special=()) == reference.encode(text)


def test_trainer_is_within_tolerance_of_sentencepiece(
    reference_model_path, ember_model_path, botchan_lines
):
    reference, ours = load(reference_model_path), load(ember_model_path)
    overlap = len(set(ours.pieces) & set(reference.pieces)) / len(reference.pieces)
    tokens_ours = sum(len(ours.encode(line, allowed_special=())) for line in botchan_lines)
    tokens_reference = sum(
        len(reference.encode(line, allowed_special=())) for line in botchan_lines
    )
    likelihood_ours = sum(ours.log_likelihood(line) for line in botchan_lines)
    likelihood_reference = sum(reference.log_likelihood(line) for line in botchan_lines)
    assert overlap >= MIN_VOCAB_OVERLAP
    assert abs(tokens_ours / tokens_reference - 1) <= MAX_TOKEN_COUNT_GAP
    assert abs(likelihood_ours / likelihood_reference - 1) <= MAX_LOG_LIKELIHOOD_GAP


def _all_segmentations(model, text):
    """Every segmentation of `text` into known pieces, with its total score."""
    results = []
    for cuts in range(len(text)):
        for inner in combinations(range(1, len(text)), cuts):
            bounds = [0, *inner, len(text)]
            parts = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
            entries = [model.lookup(part) for part in parts]
            if all(entries):
                results.append((tuple(e[0] for e in entries), sum(e[1] for e in entries)))
    return results


@pytest.mark.parametrize("alpha, nbest_size", [(1.0, -1), (0.5, -1), (1.0, 3)])
def test_sampling_frequencies_follow_the_model_probabilities(
    reference_model_path, alpha, nbest_size
):
    tokenizer = load(reference_model_path)
    word = "\u2581settlement"[:8]
    candidates = _all_segmentations(tokenizer.model, word)
    if nbest_size > 0:
        candidates = sorted(candidates, key=lambda item: -item[1])[:nbest_size]
    top = max(score for _, score in candidates)
    weights = {ids: math.exp(alpha * (score - top)) for ids, score in candidates}
    total = sum(weights.values())
    draws = 4000
    rng = random.Random(7)
    counts = Counter(
        tuple(tokenizer.sample_encode(word[1:], alpha=alpha, nbest_size=nbest_size, rng=rng))
        for _ in range(draws)
    )
    assert set(counts) <= set(weights)
    # Chi-square goodness of fit over segmentations expected at least 5 times.
    expected = {ids: draws * weight / total for ids, weight in weights.items()}
    kept = [ids for ids, value in expected.items() if value >= 5]
    statistic = sum((counts[ids] - expected[ids]) ** 2 / expected[ids] for ids in kept)
    degrees = max(len(kept) - 1, 1)
    # 99.9% quantile of chi-square, Wilson-Hilferty approximation.
    z = 3.09
    limit = degrees * (1 - 2 / (9 * degrees) + z * math.sqrt(2 / (9 * degrees))) ** 3
    assert statistic < limit, (statistic, limit, len(kept))


def test_nbest_matches_sentencepiece(spm, reference_model_path, botchan_lines):
    reference = spm.SentencePieceProcessor(model_file=str(reference_model_path))
    ours = load(reference_model_path)
    for line in botchan_lines[:50]:
        text = line[:40]
        expected = reference.nbest_encode(text, nbest_size=4)
        got = ours.nbest_encode(text, 4)
        assert got[0] == expected[0]
        assert len(got) == len(expected)


def test_digamma_matches_known_values():
    assert digamma(1.0) == pytest.approx(-0.5772156649, abs=1e-9)
    assert digamma(0.5) == pytest.approx(-1.9635100260, abs=1e-9)
    assert digamma(10.0) == pytest.approx(2.2517525891, abs=1e-9)
