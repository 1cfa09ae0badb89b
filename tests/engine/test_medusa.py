"""Medusa heads: trained by self-distillation on a real tiny model (stories260K), saved, reloaded, and drafting
inside the engine with greedy outputs token-identical to plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ember.cli.main import main
from ember.engine.config import DEFAULT_TREE_NODES, SpeculativeConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.sampling_params import SamplingParams
from ember.engine.spec.medusa_heads import CONFIG_FILE, load_medusa_heads
from ember.layers.rejection_sampler import DraftRow
from ember.models.loader import load_model
from ember.training.medusa import MedusaTrainingConfig, train_medusa_heads
from tests.engine.stories import (
    STORY_PROMPTS,
    assert_mixed_batch_matches_plain,
    run_to_completion,
    stories_llm,
)
from tests.model_factory import save_tiny_model

TRAINING = MedusaTrainingConfig(num_heads=3, steps=40, learning_rate=1e-2, batch_size=4, sequence_length=64, positions_per_window=16)


@pytest.fixture(scope="module")
def corpus(shared_dir: Path) -> Path:
    return shared_dir / "corpus" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def trained(stories_dir: Path, corpus: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("medusa") / "heads"
    return train_medusa_heads(str(stories_dir / "stories260K.bin"), [corpus], out, TRAINING, tokenizer=str(stories_dir / "tok512.bin"))


def _stories_model(stories_dir: Path) -> torch.nn.Module:
    return load_model(stories_dir / "stories260K.bin", "float32").model


def test_training_lowers_the_loss_and_the_saved_heads_reload_identically(trained, stories_dir):
    losses = trained.log.losses
    assert len(losses) == TRAINING.steps
    assert sum(losses[-8:]) / 8 < 0.9 * sum(losses[:8]) / 8
    assert (trained.out / "training.png").is_file()
    target = _stories_model(stories_dir)
    first, second = load_medusa_heads(trained.out, target), load_medusa_heads(trained.out, target)
    assert first.num_heads == 3
    hidden = torch.randn(5, 64)
    assert torch.equal(first.logits(target, hidden), second.logits(target, hidden))
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True))


@pytest.mark.parametrize("tree_nodes", [None, 0, 12])  # the default tree (7 nodes on a float model), a chain, a tree past one query chunk
def test_medusa_greedy_outputs_equal_plain_decoding_in_a_mixed_batch_and_every_block_comes_back(trained, stories_dir, tree_nodes):
    plain = stories_llm(stories_dir, block_size=4, num_kv_blocks=256)
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, speculative_method="medusa",
                       medusa_heads=str(trained.out), num_speculative_tokens=3, adaptive=False, medusa_tree_nodes=tree_nodes)
    assert spec.engine.speculator.proposer.tree_nodes == (DEFAULT_TREE_NODES if tree_nodes is None else tree_nodes)
    assert_mixed_batch_matches_plain(plain, spec, 256)


def test_the_hidden_state_handed_to_the_proposer_is_the_one_behind_each_newest_token(trained, stories_dir):
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=128, speculative_method="medusa",
                       medusa_heads=str(trained.out), num_speculative_tokens=3, adaptive=False)
    engine, proposer = spec.engine, spec.engine.speculator.proposer
    for i, text in enumerate(STORY_PROMPTS):
        engine.add_request(EngineRequest(str(i), spec.tokenizer.encode(text, add_special_tokens=True),
                           SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)))
    checked = 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            last = proposer.hidden.current(seq)
            assert last is not None  # every running decoder has a current hidden state after its step
            logits = engine.runner.model.compute_logits(last.hidden.unsqueeze(0))
            assert int(logits.argmax()) == seq.token_ids[last.position + 1]
            checked += 1
    assert checked > 50 and engine.stats().spec_accepted_tokens_total > 0


def test_heads_name_their_model_and_the_fix_for_bad_settings(trained, stories_dir, tmp_path):
    other = save_tiny_model("llama", tmp_path / "other", vocab_size=512, hidden_size=64, num_hidden_layers=5,
                            num_attention_heads=8, num_key_value_heads=4)
    with pytest.raises(ValueError, match="trained for another model"):
        load_medusa_heads(trained.out, load_model(other, "float32").model)
    with pytest.raises(ValueError, match=r"num_speculative_tokens <= 3"):
        stories_llm(stories_dir, speculative_method="medusa", medusa_heads=str(trained.out), num_speculative_tokens=4)
    untold = stories_llm(stories_dir, speculative_method="medusa", medusa_heads=str(trained.out))
    assert untold.engine.speculator.config.num_speculative_tokens == 3  # no K given: one token per head, as vLLM does
    with pytest.raises(ValueError, match="medusa_heads=DIR"):
        SpeculativeConfig(method="medusa")
    with pytest.raises(ValueError, match="medusa_tree_nodes must be from 0"):
        SpeculativeConfig(method="medusa", medusa_heads=str(trained.out), medusa_tree_nodes=63)
    with pytest.raises(ValueError, match="drop medusa_heads"):
        SpeculativeConfig(method="ngram", medusa_heads=str(trained.out))
    with pytest.raises(FileNotFoundError, match="ember medusa train"):
        load_medusa_heads(tmp_path)
    saved = json.loads((trained.out / CONFIG_FILE).read_text())
    assert saved["num_heads"] == 3 and saved["base_model"]["vocab_size"] == 512


def test_medusa_train_command_writes_heads_and_names_bad_corpora(stories_dir, corpus, tmp_path, capsys):
    model = ["--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin")]
    out = tmp_path / "heads"
    shape = ["--num-heads", "2", "--steps", "3", "--steps-per-batch", "2", "--batch-size", "2", "--sequence-length", "32"]
    assert main(["medusa", "train", *model, "--corpus", str(corpus), *shape, "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and load_medusa_heads(out).num_heads == 2
    assert main(["medusa", "train", *model, "--corpus", str(tmp_path / "missing.txt"), *shape, "--out", str(out)]) == 2
    assert "missing.txt does not exist" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.", encoding="utf-8")
    assert main(["medusa", "train", *model, "--corpus", str(short), *shape, "--out", str(out)]) == 2
    assert "one training window needs 32" in capsys.readouterr().err


def test_generate_with_medusa_prints_the_reference_greedy_story(trained, stories_dir, capsys):
    model = ["--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin")]
    flags = ["--speculative-method", "medusa", "--medusa-heads", str(trained.out), "--num-speculative-tokens", "3"]
    assert main(["generate", *model, "--prompt", "", "--max-tokens", "200", "--temperature", "0", *flags]) == 0
    assert capsys.readouterr().out == (stories_dir / "greedy_200steps_from_BOS.expected.txt").read_text(encoding="utf-8")


def _cache_rows(llm, seq, positions: list[int]) -> torch.Tensor:
    """Every layer's key and value rows of `seq` at `positions`, read through its block table."""
    table = llm.engine.kv.group_tables[0][seq.seq_id].block_ids
    block_size = llm.engine.block_size
    slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in positions])
    return torch.stack([cache.view(2, -1, *cache.shape[3:])[:, slots] for cache in llm.engine.runner.caches.tensors])


def _decode_until(llm, request_id: str, num_output_tokens: int):
    while True:
        seq = llm.engine.requests[request_id].sequences[0]
        if seq.num_output_tokens >= num_output_tokens:
            return seq
        llm.engine.step()


def test_a_tree_keeps_the_greedy_path_and_moves_its_keys_and_values_where_plain_decoding_put_them(trained, stories_dir):
    """One verification of a hand-made tree whose greedy path runs through later siblings (nodes 1, 3, 4 behind
    decoys 0 and 2): the step emits plain decoding's tokens, and the kept nodes' cache rows land at the positions
    their tokens hold, equal to the rows plain decoding computed there."""
    plain = stories_llm(stories_dir, block_size=4, num_kv_blocks=64)
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=64, speculative_method="medusa",
                       medusa_heads=str(trained.out), num_speculative_tokens=3, adaptive=False)
    assert spec.engine.speculator.proposer.tree_nodes > 0  # greedy rows draft trees on this model
    prompt = plain.tokenizer.encode(STORY_PROMPTS[0], add_special_tokens=True)
    no_drafts = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, allow_speculation=False)
    plain.engine.add_request(EngineRequest("r", prompt, no_drafts))
    spec.engine.add_request(EngineRequest("r", prompt, no_drafts))
    reference = _decode_until(plain, "r", 6)
    seq = _decode_until(spec, "r", 1)
    g = reference.output_token_ids  # g[0] is the newest token of `seq`, the tree's root
    draft = DraftRow([(g[1] + 1) % 512, g[1], (g[2] + 7) % 512, g[2], g[3]], parents=[-1, -1, 1, 1, 3])
    plan = spec.engine.scheduler.schedule({seq.seq_id: draft})
    assert plan.scheduled[0].num_new_tokens == 6
    # Rows that see every earlier row (the root, node 0) are plain causal (-1: read as a decode step reads them).
    masks = spec.engine.runner._prepare(plan.scheduled)[2].paged.span_masks.tolist()
    assert masks == [-1, -1, 0b101, 0b1101, 0b10101, 0b110101]
    result = spec.engine.runner.execute(plan)
    assert [t.token_id for t in result.sampled[seq.seq_id]] == g[1:5]
    newest = len(prompt)  # position of g[0]
    kept = list(range(newest + 1, newest + 4))
    assert torch.allclose(_cache_rows(spec, seq, kept), _cache_rows(plain, reference, kept), rtol=1e-4, atol=1e-5)


def test_bfloat16_target_drafts_with_its_float32_hidden_states_and_keeps_greedy_outputs(trained, stories_dir):
    """A bfloat16 model's compiled layers hand over float32 hidden states; the heads (cast to bfloat16) take them."""
    plain = stories_llm(stories_dir, dtype="bfloat16", block_size=4, num_kv_blocks=128)
    spec = stories_llm(stories_dir, dtype="bfloat16", block_size=4, num_kv_blocks=128, speculative_method="medusa",
                       medusa_heads=str(trained.out), num_speculative_tokens=3, adaptive=False)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    requests = {str(i): (plain.tokenizer.encode(text, add_special_tokens=True), greedy) for i, text in enumerate(STORY_PROMPTS)}
    expected, got = run_to_completion(plain, requests), run_to_completion(spec, requests)
    assert all(got[r].outputs[0].token_ids == expected[r].outputs[0].token_ids for r in requests)
    assert spec.engine.stats().spec_verifications_total > 0
