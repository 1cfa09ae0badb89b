"""tokenizer.json pipelines beyond byte-level BPE, token for token against `tokenizers`.

The reference builds and trains each tokenizer offline (WordPiece, Llama-style BPE with byte
fallback, Metaspace BPE in its three prepend schemes, Unigram, byte-level BPE with flagged
added tokens) with the normalizers, pre-tokenizers and added-token flags under test, saves
its tokenizer.json, and ember loads that file. Plus the shared MiniLM (BERT WordPiece) file.
Tolerance: none. Where the pipeline is lossless, decode(encode(x)) == x is checked too.
"""

from __future__ import annotations

import random
import unicodedata

import pytest
from tok_corpus import SCRIPTS, build_corpus

from ember.tokenizers import load
from ember.tokenizers.formats.hf.pipeline import PipelineTokenizer
from ember.tokenizers.sentencepiece.unigram import UnigramModel

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

ADDED = [
    AddedToken("<tool>", single_word=True, normalized=False),
    AddedToken("[X]", lstrip=True, rstrip=True, normalized=False),
    AddedToken("Héllo", normalized=True),
    AddedToken("ß", normalized=False),
    AddedToken("end", single_word=True, normalized=True),
]
SPECIAL = ["<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def training_texts(shared_dir):
    return build_corpus(shared_dir, count=1200, seed=70) + SCRIPTS * 3


@pytest.fixture(scope="module")
def corpus(shared_dir):
    """Parity samples, a third of them with added-token text at random places."""
    rng = random.Random(72)
    samples = build_corpus(shared_dir, count=450, seed=71)
    contents = [token.content for token in ADDED] + SPECIAL
    for index in range(0, len(samples), 3):
        text = samples[index]
        for _ in range(rng.randint(1, 3)):
            at = rng.randint(0, len(text))
            glue = rng.choice(["", " ", "  ", "\n", "x"])
            text = (
                text[:at]
                + glue
                + rng.choice(contents)
                + rng.choice(["", " ", "y", "\t"])
                + text[at:]
            )
        samples[index] = text
    return samples


def has_newer_punctuation(text: str) -> bool:
    """Whether `text` holds punctuation that Unicode 3.2 did not assign. `tokenizers` takes
    BERT's punctuation from an old table (the unicode_categories crate: U+11660, assigned in
    Unicode 9, is no punctuation to it), `regex` from a current one: a known divergence."""
    return any(
        unicodedata.category(char)[0] == "P" and unicodedata.ucd_3_2_0.category(char) == "Cn"
        for char in text
    )


def assert_parity(reference, ours, corpus, round_trip=False):
    mismatches = []
    for index, text in enumerate(corpus):
        for add_special_tokens in (False, True):
            expected = reference.encode(text, add_special_tokens=add_special_tokens).ids
            got = ours.encode(text, add_special_tokens=add_special_tokens)
            if got != expected:
                mismatches.append((index, add_special_tokens, text[:50], got[:10], expected[:10]))
        if round_trip and not mismatches and ours.decode(got) != text:
            mismatches.append((index, "decode", text[:50], ours.decode(got)[:50]))
    assert mismatches == [], f"{len(mismatches)} differ, first: {mismatches[:3]}"


def save_and_load(reference, tmp_path):
    path = tmp_path / "tokenizer.json"
    reference.save(str(path))
    return load(path)


def test_minilm_wordpiece_matches_tokenizers(shared_dir):
    path = shared_dir / "tokenizers" / "minilm" / "tokenizer.json"
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.no_truncation()
    reference.no_padding()
    ours = load(path)
    assert isinstance(ours, PipelineTokenizer)
    assert ours.encode("Hello world", add_special_tokens=True)[0] == 101  # [CLS]
    samples = build_corpus(shared_dir, count=1500, seed=73, specials=("[MASK]", "[SEP]"))
    assert_parity(reference, ours, [text for text in samples if not has_newer_punctuation(text)])


def test_llama_style_bpe_with_byte_fallback_matches_and_round_trips(
    training_texts, corpus, tmp_path
):
    reference = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    reference.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    reference.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False
    )
    reference.train_from_iterator(training_texts, trainer)
    ours = save_and_load(reference, tmp_path)
    plain = [text for text in corpus if "<" not in text and "[X]" not in text]
    assert_parity(reference, ours, plain, round_trip=True)


@pytest.mark.parametrize("scheme", ["always", "first", "never"])
def test_metaspace_bpe_matches_tokenizers(training_texts, corpus, tmp_path, scheme):
    reference = Tokenizer(models.BPE(unk_token="<unk>"))
    reference.normalizer = normalizers.NFKC()
    reference.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    reference.decoder = decoders.Metaspace(prepend_scheme=scheme)
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>"], show_progress=False)
    reference.train_from_iterator(training_texts, trainer)
    reference.add_special_tokens(SPECIAL)
    reference.add_tokens(ADDED)
    assert_parity(reference, save_and_load(reference, tmp_path), corpus)


def test_unigram_matches_tokenizers(training_texts, corpus, tmp_path):
    reference = Tokenizer(models.Unigram())
    reference.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    reference.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=4000, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False
    )
    reference.train_from_iterator(training_texts[:400] + SCRIPTS, trainer)
    reference.add_special_tokens(SPECIAL)
    assert_parity(reference, save_and_load(reference, tmp_path), corpus)


def test_unigram_sums_path_scores_in_float64_as_tokenizers_does(tmp_path):
    """Two segmentations of "abcd" whose scores tie up to rounding: float32 sums (sentencepiece's) pick a | bcd,
    HF tokenizers' float64 sums ab | cd; a tokenizer.json must give tokenizers' answer (a trained vocabulary's
    many equal rare-piece scores make such near ties)."""
    scores = {"a": -1.3, "b": -4.8999999999999995, "c": -0.3, "d": -8.7, "ab": -1.3, "bc": -0.30000000000000004,
              "cd": -7.699999999999999, "abc": -4.8999999999999995, "bcd": -7.700000000000001}
    reference = Tokenizer(models.Unigram([("<unk>", 0.0), *scores.items()], unk_id=0))
    expected = reference.encode("abcd", add_special_tokens=False).ids
    assert [reference.id_to_token(i) for i in expected] == ["ab", "cd"]
    assert save_and_load(reference, tmp_path).encode("abcd", add_special_tokens=False) == expected
    float32 = UnigramModel(list(scores), list(scores.values()))
    assert ["abcd"[n.start : n.end] for n in float32.viterbi("abcd")] == ["a", "bcd"]  # the rounding decides


def test_wordpiece_with_normalizer_and_pre_tokenizer_sequences_and_added_flags(
    training_texts, corpus, tmp_path
):
    reference = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    reference.normalizer = normalizers.Sequence(
        [
            normalizers.NFD(),
            normalizers.Lowercase(),
            normalizers.StripAccents(),
            normalizers.Replace(Regex(r"\d{4,}"), "#"),
            normalizers.Strip(),
        ]
    )
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation(behavior="contiguous"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    trainer = trainers.WordPieceTrainer(
        vocab_size=1000, special_tokens=["[UNK]", "[CLS]", "[SEP]"], show_progress=False
    )
    reference.train_from_iterator(training_texts, trainer)
    reference.add_special_tokens(SPECIAL)
    reference.add_tokens(ADDED)
    assert_parity(reference, save_and_load(reference, tmp_path), corpus)


@pytest.mark.parametrize(
    "behavior", ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]
)
def test_split_behaviours_and_bert_options_match_tokenizers(
    training_texts, corpus, tmp_path, behavior
):
    reference = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=12))
    reference.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=behavior != "removed", lowercase=False
    )
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[,.!?]|\s+"), behavior=behavior),
            pre_tokenizers.Split("e", behavior=behavior, invert=behavior == "isolated"),
            pre_tokenizers.BertPreTokenizer(),
        ]
    )
    trainer = trainers.WordPieceTrainer(
        vocab_size=800, special_tokens=["[UNK]"], show_progress=False
    )
    reference.train_from_iterator(training_texts, trainer)
    reference.add_tokens(ADDED)
    assert_parity(reference, save_and_load(reference, tmp_path), corpus[:200])


def test_byte_level_bpe_with_single_word_added_tokens_matches_and_round_trips(
    training_texts, corpus, tmp_path
):
    reference = Tokenizer(models.BPE())
    reference.normalizer = normalizers.NFKC()
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    reference.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    reference.train_from_iterator(training_texts, trainer)
    reference.add_special_tokens(SPECIAL)
    reference.add_tokens(ADDED)
    assert_parity(reference, save_and_load(reference, tmp_path), corpus)
