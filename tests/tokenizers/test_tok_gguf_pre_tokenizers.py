"""Every GGUF pre-tokenizer llama.cpp names, token for token against the `tokenizers` library.

A small byte-level BPE is trained once with `tokenizers`; for each `tokenizer.ggml.pre` name,
the same vocabulary is written (a) as a tokenizer.json whose pre_tokenizer is the Sequence of
Split("Isolated") stages llama.cpp lists for that name, plus ByteLevel without its regex, and
(b) as a GGUF vocab-only file naming the pre-tokenizer. The reference is `tokenizers` on (a);
ember reads both (a) and (b). Tolerance: none. The same check against llama.cpp itself (its
vocab-only GGUFs, on their .inp texts and the scripts corpus) runs where llama-cpp-python is
installed; test_tok_llama_cpp_vectors.py checks the .out ids without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_cpp_models import llama_cpp_models_dir, missing_reason, read_vectors
from tok_corpus import SCRIPTS, build_corpus
from tok_gguf_writer import write_vocab_gguf

from ember.tokenizers import load
from ember.tokenizers.formats.gguf.pre_tokenizers import GGUF_PRE_TOKENIZERS, gguf_pre_tokenizer
from ember.tokenizers.text.patterns import PreTokenizer, compile_stage, for_oniguruma

tokenizers = pytest.importorskip("tokenizers")

# The names issue 15 lists, plus one of each remaining distinct rule set.
NAMES = [
    "default",
    "gpt-2",
    "llama-bpe",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "falcon",
    "starcoder",
    "refact",
    "command-r",
    "qwen2",
    "qwen35",
    "stablelm2",
    "olmo",
    "dbrx",
    "smaug-bpe",
    "poro-chat",
    "jais",
    "viking",
    "tekken",
    "chameleon",
    "minerva-7b",
    "bloom",
    "gpt3-finnish",
    "exaone",
    "chatglm-bpe",
    "gpt-4o",
    "superbpe",
    "bailingmoe",
    "seed-coder",
    "smollm",
]
SAMPLES_PER_NAME = 300
# Names that share their rules with an earlier name are covered by that one's test.
DISTINCT = [
    name
    for index, name in enumerate(NAMES)
    if GGUF_PRE_TOKENIZERS[name] not in {GGUF_PRE_TOKENIZERS[n] for n in NAMES[:index]}
]


@pytest.fixture(scope="module")
def trained_spec(shared_dir):
    """tokenizer.json content of a 3,000-token byte-level BPE trained on the parity corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>"],
        show_progress=False,
    )
    texts = build_corpus(shared_dir, count=3000, seed=61) + SCRIPTS * 5
    tokenizer.train_from_iterator(texts, trainer)
    return json.loads(tokenizer.to_str())


@pytest.fixture(scope="module")
def corpus(shared_dir):
    return build_corpus(shared_dir, count=SAMPLES_PER_NAME, seed=62, specials=("<|im_start|>",))


def spec_with_pre_tokenizer(spec: dict, name: str) -> dict:
    rules = gguf_pre_tokenizer(name)
    splits = [
        {"type": "Split", "pattern": {"Regex": stage}, "behavior": "Isolated", "invert": False}
        for stage in rules.stages
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    changed = json.loads(json.dumps(spec))
    changed["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [*splits, {**byte_level, "use_regex": False}],
    }
    changed["model"]["ignore_merges"] = rules.ignore_merges
    return changed


def write_gguf_of(spec: dict, name: str, path: Path) -> None:
    vocab = spec["model"]["vocab"]
    tokens = [""] * len(vocab)
    for token, token_id in vocab.items():
        tokens[token_id] = token
    special = {entry["id"] for entry in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    write_vocab_gguf(
        path,
        "gpt2",
        tokens=tokens,
        types=[3 if i in special else 1 for i in range(len(tokens))],
        token_merges=merges,
        tokenizer_pre=name,
    )


@pytest.mark.parametrize("name", DISTINCT)
def test_gguf_pre_tokenizer_matches_tokenizers(trained_spec, corpus, tmp_path, name):
    spec = spec_with_pre_tokenizer(trained_spec, name)
    json_path = tmp_path / "tokenizer.json"
    json_path.write_text(json.dumps(spec), encoding="utf-8")
    gguf_path = tmp_path / "vocab.gguf"
    write_gguf_of(spec, name, gguf_path)
    reference = tokenizers.Tokenizer.from_file(str(json_path))
    for ours in (load(json_path), load(gguf_path)):
        mismatches = []
        for index, text in enumerate(corpus):
            expected = reference.encode(text).ids
            got = ours.encode(text)
            if got != expected:
                mismatches.append((index, text[:50], got[:10], expected[:10]))
            elif ours.decode(got) != text:
                mismatches.append((index, text[:50], "decode"))
        assert mismatches == [], f"{ours}: {len(mismatches)} differ, first {mismatches[:2]}"


def test_every_named_rule_set_is_covered():
    covered = {GGUF_PRE_TOKENIZERS[name] for name in NAMES}
    assert covered == set(GGUF_PRE_TOKENIZERS.values())


def test_ignore_merges_takes_a_whole_token_piece_that_merges_cannot_reach(tmp_path):
    # Llama 3 (llama-bpe) has tokens no merge sequence builds, " Việt" among them: llama.cpp
    # and HF take a piece that is a token whole. Here "ab" is a token with no merge.
    byte_tokens = [chr(c) for c in range(ord("a"), ord("d"))]
    tokens = [*byte_tokens, "ab"]
    for name, expected in (("llama-bpe", [3]), ("gpt-2", [0, 1])):
        path = tmp_path / f"{name}.gguf"
        write_vocab_gguf(
            path, "gpt2", tokens=tokens, types=[1] * 4, token_merges=[], tokenizer_pre=name
        )
        assert load(path).encode("ab") == expected, name


def test_unknown_and_inexpressible_pre_tokenizers_say_so():
    with pytest.raises(ValueError, match="custom Han-script code"):
        gguf_pre_tokenizer("kimi-k2")
    with pytest.raises(ValueError, match="not supported.*supported: "):
        gguf_pre_tokenizer("no-such-tokenizer")


LLAMA_CPP_VOCABS = [
    "llama-bpe",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "gpt-2",
    "mpt",
    "starcoder",
    "qwen2",
    "refact",
    "command-r",
    "phi-3",
    "bert-bge",
    "llama-spm",
    "gpt-4o",
    "qwen35",
]


@pytest.mark.parametrize("vocab", LLAMA_CPP_VOCABS)
def test_llama_cpp_vocab_files_match_llama_cpp(vocab):
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed: llama.cpp parity not checked"
    )
    folder = llama_cpp_models_dir()
    if not folder.is_dir():
        pytest.skip(missing_reason(folder))
    path = folder / f"ggml-vocab-{vocab}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is not in this llama.cpp checkout")
    texts = [text for text, _ in read_vectors(folder, vocab)]
    reference = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = load(path)
    for text in texts + SCRIPTS:
        expected = reference.tokenize(text.encode(), add_bos=False, special=False)
        assert ours.encode(text, allowed_special=()) == expected, text


@pytest.mark.parametrize(
    "stages",
    [
        ("(?i)ab|x",),
        ("(IMG)((A|B){1,2})Z", r"\p{N}"),
        (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
        (r"\s+$", r"[\p{P}\$]+"),
    ],
)
def test_split_stages_with_flags_groups_lookarounds_and_anchors_cut_like_tokenizers(corpus, stages):
    from tokenizers import Regex, pre_tokenizers

    reference = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(stage), behavior="isolated") for stage in stages]
    )
    ours = PreTokenizer.from_stages([for_oniguruma(stage) for stage in stages])
    samples = ["xxABab12Ab", "IMGABZ IMGAZ1234567", "a,$b.  ", *corpus[:150]]
    for text in samples:
        assert ours.split(text) == [piece for piece, _ in reference.pre_tokenize_str(text)], text


@settings(max_examples=120, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab 1234\n日本,.$'é\u0301<>:sentinel0IMGZ²٣\u2003©`~|+"), max_size=60))
def test_every_rule_set_cuts_random_text_like_its_stages_one_by_one(text):
    # The stage loop skips pieces no match can cut, and fused patterns replace whole stage
    # sequences; this checks both against the plain loop.
    for rules in set(GGUF_PRE_TOKENIZERS.values()):
        pieces = [text] if text else []
        for stage in rules.stages:
            pieces = [sub for piece in pieces for sub in _isolated(stage, piece)]
        assert rules.build().split(text) == pieces, rules.stages


def _isolated(stage: str, text: str) -> list[str]:
    out, position = [], 0
    for match in regex.finditer(stage, text):
        out += [text[position : match.start()], match.group()]
        position = match.end()
    return [piece for piece in [*out, text[position:]] if piece]


# One character of every class deepseek-llm's single pattern tells apart: ASCII and other cased
# letters inside and outside deepseek-llm's CJK range K (ệ, Ω), whitespace inside K (U+2003,
# U+3000) and outside it, newlines, ASCII, fullwidth and K punctuation, digits inside K (१)
# and outside it, uncased letters, marks, symbols, emoji, ZWJ, private-use, unassigned and
# control characters, and kana: letters, a mark, symbols, punctuation and an unassigned code
# point (U+3097).
SINGLE_PATTERN_ALPHABET = (
    "aZＡ éệΩµǅ\t\u3000\u2003\xa0\x85\u2028\x0b\r\n.,!-_[]\\'！’“。、1१²٣日한ก😀©\u0301"  # noqa: RUF001
    "\u200d\ue000\u0378\x00sアー・゛\u3099\u3097"
)


@pytest.mark.parametrize("name", ["deepseek-llm", "deepseek-coder", "chameleon"])
@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(SINGLE_PATTERN_ALPHABET), max_size=40))
def test_fast_rules_cut_like_their_stages_on_every_class(name, text):
    rules = gguf_pre_tokenizer(name)
    pieces = [text] if text else []
    for stage in rules.stages:
        pieces = [sub for piece in pieces for sub in _isolated(stage, piece)]
    assert rules.build().split(text) == pieces


def test_a_stage_with_only_shared_syntax_runs_on_re_and_one_with_classes_on_regex():
    # \s differs between the engines (re's takes U+001C-001F), so a class escape keeps `regex`.
    assert isinstance(compile_stage("[\\u0041-\\u005a]+|(?:x(?=y))+"), re.Pattern)
    assert isinstance(compile_stage("\\s+"), regex.Pattern)
    assert isinstance(compile_stage("(?i)ab"), regex.Pattern)
    assert isinstance(compile_stage("[[:alpha:]]"), regex.Pattern)
