"""The EAGLE-style head: trained by self-distillation on a real tiny model (stories260K), saved, reloaded, and
drafting token by token inside the engine, with greedy outputs token-identical to plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ember.cli.main import main
from ember.engine.engine_request import EngineRequest
from ember.engine.sampling_params import SamplingParams
from ember.engine.spec.eagle_head import CONFIG_FILE, load_eagle_head
from ember.engine.spec.lm_head_rows import lm_head_rows
from ember.models.loader import load_model
from ember.quant.ggml.layers import GGMLLogitsLinear
from ember.training.eagle import EagleTrainingConfig, draft_vocabulary, train_eagle_head
from tests.engine.stories import (
    STORY_PROMPTS,
    assert_mixed_batch_matches_plain,
    stories_llm,
)
from tests.model_factory import save_tiny_model

TRAINING = EagleTrainingConfig(steps=40, learning_rate=1e-2, batch_size=4, sequence_length=64, positions_per_window=16,
                               draft_vocab_size=300)


@pytest.fixture(scope="module")
def corpus(shared_dir: Path) -> Path:
    return shared_dir / "corpus" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def trained(stories_dir: Path, corpus: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle") / "head"
    return train_eagle_head(str(stories_dir / "stories260K.bin"), [corpus], out, TRAINING, tokenizer=str(stories_dir / "tok512.bin"))


def _stories_model(stories_dir: Path) -> torch.nn.Module:
    return load_model(stories_dir / "stories260K.bin", "float32").model


def test_training_lowers_the_loss_and_the_saved_head_reloads_identically(trained, stories_dir):
    losses = trained.log.losses
    assert len(losses) == TRAINING.steps and len(trained.log.step_accuracy[-1]) == TRAINING.unroll
    assert sum(losses[-8:]) / 8 < 0.9 * sum(losses[:8]) / 8
    assert (trained.out / "training.png").is_file()
    target = _stories_model(stories_dir)
    first, second = load_eagle_head(trained.out, target), load_eagle_head(trained.out, target)
    feature, embedding = torch.randn(5, 64), torch.randn(5, 64)
    assert torch.equal(first(feature, embedding), second(feature, embedding))
    assert len(first.vocab_ids) == 300 and torch.equal(first.vocab_ids, second.vocab_ids)
    # the draft vocabulary's rows are the LM head's own: their logits are the full logits at those ids
    rows = lm_head_rows(target, first.vocab_ids)
    assert torch.allclose(feature @ rows.t(), target.compute_logits(feature)[:, first.vocab_ids], rtol=1e-5, atol=1e-5)


def test_a_quantized_heads_rows_are_read_through_its_int8_activations(smollm2_gguf: Path):
    # the GGUF's LM head rounds its input to int8 per 32 values: the linearity probe is one that rounding keeps
    target = load_model(smollm2_gguf, "auto").model
    assert isinstance(target.lm_head, GGMLLogitsLinear) and target.lm_head.activations == "int8"
    ids = torch.tensor([0, 17, 49151])
    assert torch.equal(lm_head_rows(target, ids), target.lm_head.weight_blocks.dequantize()[ids])


def test_the_draft_vocabulary_takes_the_most_frequent_tokens_then_the_lowest_ids():
    assert draft_vocabulary([9, 9, 9, 4, 4, 7], vocab_size=12, size=4).tolist() == [0, 4, 7, 9]
    assert draft_vocabulary([9, 9, 9, 4, 4, 7], vocab_size=12, size=2).tolist() == [4, 9]
    assert draft_vocabulary([], vocab_size=3, size=8).tolist() == [0, 1, 2]


def test_eagle_greedy_outputs_equal_plain_decoding_in_a_mixed_batch_and_every_block_comes_back(trained, stories_dir):
    plain = stories_llm(stories_dir, block_size=4, num_kv_blocks=256)
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, speculative_method="eagle",
                       eagle_head=str(trained.out), num_speculative_tokens=3, adaptive=False)
    assert_mixed_batch_matches_plain(plain, spec, 256)


def test_a_sampled_draft_carries_its_distribution_over_the_draft_vocabulary_only(trained, stories_dir):
    spec = stories_llm(stories_dir, speculative_method="eagle", eagle_head=str(trained.out), num_speculative_tokens=3,
                       adaptive=False)
    proposer = spec.engine.speculator.proposer
    engine = spec.engine
    engine.add_request(EngineRequest("s", spec.tokenizer.encode(STORY_PROMPTS[0], add_special_tokens=True),
                       SamplingParams(temperature=1.0, max_tokens=8, seed=1, ignore_eos=True)))
    engine.step()  # the prompt: the proposer now holds the hidden state behind the first sampled token
    drafts = proposer.propose({seq: 3 for seq in engine.scheduler.running})
    (draft,) = drafts.values()
    assert len(draft.token_ids) == 3 and draft.probs is not None and draft.probs.shape == (3, 512)
    outside = torch.ones(512, dtype=torch.bool)
    outside[proposer.head.vocab_ids] = False
    assert torch.all(draft.probs[:, outside] == 0)
    assert torch.allclose(draft.probs.sum(dim=1), torch.ones(3))
    assert all(draft.probs[i, token] > 0 for i, token in enumerate(draft.token_ids))


def test_heads_name_their_model_and_the_fix_for_bad_settings(trained, stories_dir, tmp_path):
    other = save_tiny_model("llama", tmp_path / "other", vocab_size=512, hidden_size=64, num_hidden_layers=5,
                            num_attention_heads=8, num_key_value_heads=4)
    with pytest.raises(ValueError, match="trained for another model"):
        load_eagle_head(trained.out, load_model(other, "float32").model)
    with pytest.raises(FileNotFoundError, match="ember eagle train"):
        load_eagle_head(tmp_path)
    with pytest.raises(ValueError, match="--unroll"):
        EagleTrainingConfig(unroll=0)
    saved = json.loads((trained.out / CONFIG_FILE).read_text())
    assert saved["draft_vocab_size"] == 300 and saved["base_model"]["vocab_size"] == 512


def test_eagle_train_command_writes_a_head_and_generate_drafts_with_it(stories_dir, corpus, tmp_path, capsys):
    model = ["--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin")]
    out = tmp_path / "head"
    shape = ["--steps", "3", "--steps-per-batch", "2", "--batch-size", "2", "--sequence-length", "32", "--draft-vocab", "128"]
    assert main(["eagle", "train", *model, "--corpus", str(corpus), *shape, "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and len(load_eagle_head(out).vocab_ids) == 128
    replies = ["--self-generate", "3", "--reply-tokens", "40"]  # trained on the model's own continuations of snippets
    assert main(["eagle", "train", *model, "--corpus", str(corpus), *shape, *replies, "--out", str(tmp_path / "own")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "own" / CONFIG_FILE).is_file()
    assert main(["eagle", "train", *model, "--corpus", str(tmp_path / "missing.txt"), *shape, "--out", str(out)]) == 2
    assert "missing.txt does not exist" in capsys.readouterr().err
    flags = ["--speculative-method", "eagle", "--eagle-head", str(out), "--num-speculative-tokens", "3"]
    assert main(["generate", *model, "--prompt", "", "--max-tokens", "200", "--temperature", "0", *flags]) == 0
    assert capsys.readouterr().out == (stories_dir / "greedy_200steps_from_BOS.expected.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("family", ["gpt2", "granite", "gemma2"])
def test_a_head_trains_and_drafts_for_families_laid_out_unlike_llama(family, stories_dir, corpus, tmp_path):
    """GPT-2 names its embedding wte, Granite divides its logits by a scale, Gemma 2 keeps two KV layer groups: the
    head reads each target through its own input_embedding(), compute_logits and cache layout."""
    from ember.llm import LLM

    model = str(save_tiny_model(family, tmp_path / family, vocab_size=512))
    tokenizer = str(stories_dir / "tok512.bin")
    config = EagleTrainingConfig(steps=6, learning_rate=1e-2, batch_size=2, sequence_length=32, positions_per_window=8,
                                 draft_vocab_size=300)
    trained = train_eagle_head(model, [corpus], tmp_path / "head", config, tokenizer=tokenizer)
    assert len(trained.log.losses) == 6
    plain = LLM(model, tokenizer=tokenizer, block_size=4, num_kv_blocks=256)
    spec = LLM(model, tokenizer=tokenizer, block_size=4, num_kv_blocks=256, speculative_method="eagle",
               eagle_head=str(trained.out), adaptive=False)
    assert_mixed_batch_matches_plain(plain, spec, 256)
