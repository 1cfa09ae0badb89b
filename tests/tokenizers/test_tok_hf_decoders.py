"""tokenizer.json decoding, full and streamed, against `tokenizers` on small trained vocabularies.

`tokenizers` runs its decoder chain over the id list as given: only the list's very first token
loses its leading space (Metaspace, Llama's Strip), even when it is a special token; a run of
byte tokens that is not valid UTF-8 becomes one U+FFFD per token (ByteFallback); and without a
decoder the tokens are joined with spaces. Tolerance: none.
"""

from __future__ import annotations

import random

import pytest

from ember.tokenizers import IncrementalDecoder, load

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

TRAINING_TEXTS = ["hello world, the quick brown fox"] * 50
BYTE_TOKENS = [f"<0x{byte:02X}>" for byte in range(256)]


def streamed(tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
    return decoder.push_many(ids) + decoder.flush()


def metaspace(scheme: str) -> Tokenizer:
    reference = Tokenizer(models.BPE(unk_token="<unk>"))
    reference.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    reference.decoder = decoders.Metaspace(prepend_scheme=scheme)
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>"], show_progress=False)
    reference.train_from_iterator(TRAINING_TEXTS, trainer)
    return reference


def llama_style() -> Tokenizer:
    reference = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    reference.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    reference.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", *BYTE_TOKENS], show_progress=False
    )
    reference.train_from_iterator(TRAINING_TEXTS, trainer)
    return reference


def word_piece_without_decoder() -> Tokenizer:
    reference = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    reference.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]", "[CLS]"], show_progress=False)
    reference.train_from_iterator(TRAINING_TEXTS, trainer)
    return reference


BUILDERS = {
    "metaspace_first": lambda: metaspace("first"),
    "metaspace_always": lambda: metaspace("always"),
    "llama_style": llama_style,
    "word_piece_without_decoder": word_piece_without_decoder,
}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def pair(request, tmp_path_factory):
    """(reference, ember's tokenizer of the reference's saved tokenizer.json)."""
    reference = BUILDERS[request.param]()
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    reference.save(str(path))
    return reference, load(path)


def assert_decodes_like_tokenizers(reference, ours, ids: list[int]) -> None:
    for skip in (False, True):
        expected = reference.decode(ids, skip_special_tokens=skip)
        assert ours.decode(ids, skip_special_tokens=skip) == expected, (ids, skip)
        assert streamed(ours, ids, skip) == expected, (ids, skip)


@pytest.mark.parametrize("text", ["<s> hello", "<s>hello", "<unk> world", "[CLS] hello world", " hello"])
def test_only_the_first_token_of_the_list_loses_its_space(pair, text):
    reference, ours = pair
    ids = reference.encode(text, add_special_tokens=False).ids
    assert ours.encode(text) == ids
    assert_decodes_like_tokenizers(reference, ours, ids)


@pytest.mark.parametrize(
    "run",
    [["<0x49>", "<0xAD>"], ["<0xE6>", "<0x97>"], ["<0xE6>", "<0x97>", "<0xA5>"], ["<0x20>", "<0xAD>"]],
)
def test_an_invalid_byte_run_is_one_replacement_per_token_like_bytefallback(tmp_path, run):
    reference = llama_style()
    reference.save(str(tmp_path / "tokenizer.json"))
    ours = load(tmp_path / "tokenizer.json")
    run_ids = [reference.token_to_id(token) for token in run]
    hello = reference.encode("hello", add_special_tokens=False).ids
    for ids in (run_ids, hello + run_ids, run_ids + hello, hello + run_ids + run_ids[:1] + hello):
        assert_decodes_like_tokenizers(reference, ours, ids)


def test_random_id_lists_decode_like_tokenizers(pair):
    reference, ours = pair
    rng = random.Random(11)
    size = reference.get_vocab_size()
    for _ in range(300):
        assert_decodes_like_tokenizers(reference, ours, [rng.randrange(size) for _ in range(rng.randint(1, 6))])
