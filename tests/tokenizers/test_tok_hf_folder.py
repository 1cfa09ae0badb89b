"""What an HF model folder adds to its tokenizer file: the chat template (tokenizer_config.json, chat_template.jinja,
chat_template.json) and the ids that end generation (end-of-turn tokens, generation_config.json's eos_token_id), for
tokenizer.json pipelines (Llama-2 / Gemma-style BPE with byte fallback) and SentencePiece .model files alike."""

from __future__ import annotations

import json
import shutil

import pytest

from ember.tokenizers import load
from ember.tokenizers.chat_template import load_chat_template
from ember.tokenizers.formats.hf.pipeline import PipelineTokenizer

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, normalizers, trainers  # noqa: E402

TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"


@pytest.fixture(scope="module")
def byte_fallback_json(tmp_path_factory, shared_dir):
    """A Gemma-style tokenizer.json (BPE over ▁-joined words with byte fallback) with <end_of_turn> as a special."""
    reference = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    reference.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    reference.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", *[f"<0x{b:02X}>" for b in range(256)]]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False)
    reference.train_from_iterator((shared_dir / "corpus" / "botchan.txt").read_text().splitlines()[:2000], trainer)
    path = tmp_path_factory.mktemp("json") / "tokenizer.json"
    reference.save(str(path))
    return path, reference.token_to_id("<end_of_turn>"), reference.token_to_id("<eos>")


def _folder(tmp_path, source, files: dict[str, object]):
    shutil.copy(source, tmp_path / source.name)
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return tmp_path


@pytest.mark.parametrize(
    "files",
    [
        {"tokenizer_config.json": {"eos_token": "<eos>", "chat_template": TEMPLATE}},
        {"tokenizer_config.json": {"eos_token": {"content": "<eos>"}, "chat_template": [
            {"name": "tool_use", "template": "tools"}, {"name": "default", "template": TEMPLATE}]}},
        {"tokenizer_config.json": {"eos_token": "<eos>"}, "chat_template.jinja": TEMPLATE},
        {"tokenizer_config.json": {"eos_token": "<eos>"}, "chat_template.json": {"chat_template": TEMPLATE}},
    ],
    ids=["tokenizer-config", "named-templates", "jinja-file", "processor-json"],
)
def test_a_pipeline_tokenizer_takes_its_folders_chat_template_and_stops_at_end_of_turn(byte_fallback_json, tmp_path, files):
    path, end_of_turn, eos = byte_fallback_json
    tokenizer = load(_folder(tmp_path, path, files))
    assert isinstance(tokenizer, PipelineTokenizer)
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.eos_ids == {eos, end_of_turn}
    rendered = load_chat_template(tokenizer).render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert rendered.startswith("<start_of_turn>user\nHi") and end_of_turn in tokenizer.encode(rendered)


def test_generation_config_eos_ids_end_generation_too(byte_fallback_json, tmp_path):
    path, end_of_turn, eos = byte_fallback_json
    folder = _folder(tmp_path, path, {"tokenizer_config.json": {"eos_token": "<eos>"},
                                      "generation_config.json": {"eos_token_id": [eos, 7, 9]}})
    tokenizer = load(folder)
    assert tokenizer.chat_template is None
    assert tokenizer.eos_ids == {eos, end_of_turn, 7, 9}


def test_a_sentencepiece_model_in_a_folder_takes_its_chat_template_and_stop_ids(shared_dir, tmp_path):
    folder = _folder(tmp_path, shared_dir / "tokenizers" / "llama2" / "tokenizer.model",
                     {"tokenizer_config.json": {"chat_template": TEMPLATE}, "generation_config.json": {"eos_token_id": 2}})
    tokenizer = load(folder)
    assert tokenizer.chat_template == TEMPLATE and tokenizer.eos_ids == {2}
    alone = load(shared_dir / "tokenizers" / "llama2" / "tokenizer.model")
    assert alone.chat_template is None


def test_a_folder_with_vocab_json_and_merges_txt_encodes_as_the_tokenizer_transformers_converts_it_to(tmp_path, shared_dir):
    """transformers' slow-tokenizer files (OPT's and many GPT-2-style folders ship no tokenizer.json): the same BPE,
    GPT-2's byte-level pre-tokenizer, tokenizer_config.json's special tokens and its add_bos_token."""
    from tokenizers import pre_tokenizers

    from tests.tokenizers.tok_corpus import build_corpus

    shutil.copy(shared_dir / "tokenizers" / "gpt2" / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(shared_dir / "tokenizers" / "gpt2" / "vocab.bpe", tmp_path / "merges.txt")
    config = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>"}, "add_bos_token": True,
              "added_tokens_decoder": {"50256": {"content": "<|endoftext|>", "special": True}}}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    reference = Tokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens(["<|endoftext|>"])
    ours = load(tmp_path)
    assert (ours.bos_id, ours.eos_id) == (50256, 50256)
    for text in build_corpus(shared_dir, count=300, seed=3, specials=("<|endoftext|>",)):
        expected = reference.encode(text).ids
        assert ours.encode(text, add_special_tokens=False) == expected, text
        assert ours.encode(text, add_special_tokens=True) == [50256, *expected]
        assert ours.decode(expected) == reference.decode(expected, skip_special_tokens=False)


def test_a_post_processor_appending_eos_is_honoured_on_the_byte_level_path(tmp_path, shared_dir):
    """Embedding models (Qwen3-Embedding) append EOS to every text, where their last-token pooling reads."""
    from tests.tokenizers.tok_corpus import build_corpus

    spec = json.loads((shared_dir / "tokenizers" / "smollm2" / "tokenizer.json").read_text())
    eos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}, eos],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}, eos],
                              "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}  # fmt: skip
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ours = load(tmp_path / "tokenizer.json")
    for text in build_corpus(shared_dir, count=100, seed=4):
        assert ours.encode(text, add_special_tokens=True) == reference.encode(text).ids, text
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False).ids
