"""Speculative decoding in the engine: greedy outputs equal plain decoding for every proposer, KV rolls back.

n-gram proposals run on stories260K (real tokenizer, so stop strings work); the draft-model
proposer on two tiny random Llama checkpoints with the same vocabulary. Random and tiny models
repeat themselves, so n-gram drafts do get accepted and the kept-draft paths are exercised.
"""

from __future__ import annotations

import pytest
import torch

from ember.engine.config import EngineConfig, SpeculativeConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.request import Request, Sequence
from ember.engine.sampling_params import SamplingParams
from ember.engine.spec.draft_model import DraftModelProposer
from ember.llm import LLM
from ember.models.loader import load_model
from tests.engine.stories import run_to_completion, stories_llm
from tests.model_factory import save_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
STORY_PROMPTS = (
    "Once upon a time there was a little girl named Lily. She",
    "The cat sat on the mat. The cat sat on the",
    "Tom had a big red ball. Tom liked the big red ball. Tom",
    "One day, a bird",
)


def _token_ids(outputs) -> dict[str, list[list[int]]]:
    return {request_id: [c.token_ids for c in out.outputs] for request_id, out in outputs.items()}


def _stories_requests(llm: LLM, params: SamplingParams = GREEDY) -> dict:
    return {str(i): (llm.tokenizer.encode(text, add_special_tokens=True), params) for i, text in enumerate(STORY_PROMPTS)}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spec_models")
    target = save_tiny_model("llama", folder / "target", seed=0)
    other = save_tiny_model("llama", folder / "other", seed=1, num_hidden_layers=1)
    return target, other


def test_ngram_greedy_outputs_equal_plain_decoding_in_a_mixed_batch_and_every_block_comes_back(stories_dir):
    plain = stories_llm(stories_dir, block_size=4, num_kv_blocks=256)
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, speculative_method="ngram", num_speculative_tokens=4)
    requests = _stories_requests(plain)
    requests["opt-out"] = (requests["0"][0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, allow_speculation=False))
    requests["forks"] = (requests["1"][0], SamplingParams(n=2, temperature=0, max_tokens=30, ignore_eos=True))
    expected = _token_ids(run_to_completion(plain, requests))
    got = _token_ids(run_to_completion(spec, requests))
    stats = spec.engine.stats()
    assert got == expected
    assert stats.spec_accepted_tokens_total > 0 and stats.spec_verifications_total > 0
    assert stats.generation_tokens_total == plain.engine.stats().generation_tokens_total
    assert spec.engine.kv.num_free_blocks == 256


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_ngram_with_chunked_prefill_prefix_caching_and_preemption_keeps_greedy_outputs(stories_dir, kv_cache_dtype):
    options = dict(block_size=4, num_kv_blocks=40, max_num_batched_tokens=16, kv_cache_dtype=kv_cache_dtype)
    plain = stories_llm(stories_dir, **options)
    spec = stories_llm(stories_dir, speculative_method="ngram", num_speculative_tokens=3, **options)
    requests = _stories_requests(plain)
    requests["again"] = requests["2"]  # shares every full block of request 2's prompt
    expected = _token_ids(run_to_completion(plain, requests))
    got = _token_ids(run_to_completion(spec, requests))
    assert got == expected
    assert spec.engine.stats().num_preemptions > 0
    assert spec.engine.stats().prefix_cache_hits > 0
    assert spec.engine.kv.num_free_blocks == 40


def test_a_stop_string_inside_kept_drafts_ends_the_sequence_there_as_without_speculation(stories_dir):
    plain = stories_llm(stories_dir, block_size=4, num_kv_blocks=128)
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=128, speculative_method="ngram", num_speculative_tokens=4)
    prompt = plain.tokenizer.encode("The cat sat on the mat. The cat sat on the", add_special_tokens=True)
    # Greedy output: "ground. The| cat was ..." where " cat was" comes in one step as two kept
    # drafts plus one token: the stop completes on the second of the three.
    params = SamplingParams(temperature=0, max_tokens=40, stop=["The cat"], logprobs=2)
    expected = run_to_completion(plain, {"a": (prompt, params)})["a"].outputs[0]
    got = run_to_completion(spec, {"a": (prompt, params)})["a"].outputs[0]
    assert (got.text, got.token_ids, got.finish_reason, got.stop_reason) == (
        expected.text, expected.token_ids, expected.finish_reason, expected.stop_reason,
    )
    assert got.finish_reason == "stop" and spec.engine.stats().spec_accepted_tokens_total > 0
    assert [sorted(p) for p in got.logprobs] == [sorted(p) for p in expected.logprobs]
    for mine, theirs in zip(got.logprobs, expected.logprobs, strict=True):
        for token_id, logprob in mine.items():
            assert logprob.logprob == pytest.approx(theirs[token_id].logprob, abs=1e-4)
    assert spec.engine.kv.num_free_blocks == 128


def test_logit_biased_requests_decode_as_without_speculation_beside_one_that_speculates(stories_dir):
    plain = stories_llm(stories_dir, block_size=4, num_kv_blocks=256)
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, speculative_method="ngram", num_speculative_tokens=4)
    prompt = plain.tokenizer.encode("The cat sat on the mat. The cat sat on the", add_special_tokens=True)
    unbiased = run_to_completion(plain, {"a": (prompt, GREEDY)})["a"].outputs[0].token_ids
    forced, banned = prompt[2], unbiased[0]  # a prompt token the lookup would draft after; the greedy choice
    requests = {
        "forced": (prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias={forced: 100.0})),
        "banned": (prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias={banned: -100.0})),
        "plain": (prompt, GREEDY),
    }
    expected = _token_ids(run_to_completion(plain, requests))
    got = _token_ids(run_to_completion(spec, requests))
    assert got == expected
    assert got["forced"][0] == [forced] * 40 and banned not in got["banned"][0] and got["plain"][0] == unbiased
    assert spec.engine.stats().spec_accepted_tokens_total > 0  # the unbiased request did speculate
    assert spec.engine.kv.num_free_blocks == 256


def test_seeded_sampling_with_speculation_repeats_whatever_shares_the_batch(stories_dir):
    spec = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, speculative_method="ngram", num_speculative_tokens=4)
    prompt = spec.tokenizer.encode("Tom had a big red ball. Tom liked the big red ball. Tom", add_special_tokens=True)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=30, ignore_eos=True)
    alone = run_to_completion(spec, {"a": (prompt, params)})["a"].outputs[0].token_ids
    crowd = dict(_stories_requests(spec, SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)), seeded=(prompt, params))
    together = run_to_completion(spec, crowd)["seeded"].outputs[0].token_ids
    assert together == alone
    assert spec.engine.kv.num_free_blocks == 256


@pytest.mark.parametrize(("draft", "kv_cache_dtype"), [("self", "auto"), ("other", "auto"), ("self", "fp8")])
def test_draft_model_greedy_outputs_equal_plain_decoding_and_both_caches_empty(tiny_models, draft, kv_cache_dtype):
    target, other = tiny_models
    draft_path = target if draft == "self" else other
    plain = LLM(str(target), block_size=4, num_kv_blocks=128, kv_cache_dtype=kv_cache_dtype)
    spec = LLM(str(target), block_size=4, num_kv_blocks=128, speculative_method="draft", draft_model=str(draft_path),
               num_speculative_tokens=3, kv_cache_dtype=kv_cache_dtype)
    proposer = spec.engine.speculator.proposer
    assert proposer.draft_token_cost_s() > 0  # timed on throwaway sequences at start ...
    assert proposer.kv.num_free_blocks == 128  # ... which left nothing behind
    assert proposer.catch_up_cost_s(_fresh_sequence(300)) > 0  # catch-ups of two lengths: a line, any length
    prompts = {"a": [1, 5, 9, 13, 200, 17], "b": [3, 4, 5, 6, 7, 8, 9, 10, 11], "c": [100, 20, 30]}
    requests = {name: (p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)) for name, p in prompts.items()}
    requests["sampled"] = ([7, 8, 9], SamplingParams(temperature=0.9, seed=1, max_tokens=20, ignore_eos=True))
    expected = _token_ids(run_to_completion(plain, requests))
    got = _token_ids(run_to_completion(spec, requests))
    stats = spec.engine.stats()
    assert {k: v for k, v in got.items() if k != "sampled"} == {k: v for k, v in expected.items() if k != "sampled"}
    assert len(got["sampled"][0]) == 20
    if draft == "self":  # the target drafting for itself: greedy drafts are all kept
        assert stats.spec_acceptance_rate > 0.9
    assert stats.spec_verifications_total > 0
    assert spec.engine.kv.num_free_blocks == 128
    assert spec.engine.speculator.proposer.kv.num_free_blocks == 128
    if kv_cache_dtype == "fp8":  # an explicit cache dtype holds for the draft's cache too
        assert spec.engine.speculator.proposer.runner.kv_caches[0].dtype == torch.float8_e4m3fn


def test_a_draft_model_with_sliding_window_layers_keeps_a_table_per_layer_group(tmp_path):
    """Gemma 2 alternates windowed and global layers (two KV layer groups); the draft's cache keeps both tables."""
    target = save_tiny_model("gemma2", tmp_path / "gemma2")
    plain = LLM(str(target), block_size=4, num_kv_blocks=128)
    spec = LLM(str(target), block_size=4, num_kv_blocks=128, speculative_method="draft", draft_model=str(target),
               num_speculative_tokens=3, adaptive=False)
    assert spec.engine.speculator.proposer.kv.group_windows == spec.engine.kv.group_windows == (8, None)
    prompts = {"long": list(range(3, 27)), "short": [5, 6, 7], "repeat": [9, 10, 11, 12] * 5}
    requests = {name: (p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)) for name, p in prompts.items()}
    expected = _token_ids(run_to_completion(plain, requests))
    assert _token_ids(run_to_completion(spec, requests)) == expected
    assert spec.engine.stats().spec_acceptance_rate > 0.9  # the target drafting for itself
    assert spec.engine.kv.num_free_blocks == spec.engine.speculator.proposer.kv.num_free_blocks == 128


def test_a_runner_refuses_a_cache_manager_without_the_models_layer_groups(tmp_path):
    from ember.engine.runner import ModelRunner
    from ember.kv.cache_manager import KVCacheManager
    from ember.layers.sampler import Sampler

    model = load_model(save_tiny_model("gemma2", tmp_path / "gemma2"), "float32").model
    with pytest.raises(ValueError, match="kv_cache_layout"):
        ModelRunner(model, 16, 4, KVCacheManager(16, 4), Sampler(torch.Generator()), frozenset())


def test_speculative_config_names_the_fix_for_bad_settings():
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig(method="draft")
    with pytest.raises(ValueError, match="choose one of"):
        SpeculativeConfig(method="lookahead")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="eagle_head=DIR"):
        EngineConfig(model="m", speculative=SpeculativeConfig(method="eagle"))
    with pytest.raises(ValueError, match="drop eagle_head"):
        SpeculativeConfig(method="ngram", eagle_head="heads")


def test_a_lookup_drafts_deeper_than_a_priced_proposer_unless_told():
    assert SpeculativeConfig(method="ngram").num_speculative_tokens == 8
    assert SpeculativeConfig(method="draft", draft_model="m").num_speculative_tokens == 4
    assert SpeculativeConfig(method="ngram", num_speculative_tokens=3).num_speculative_tokens == 3


def _fresh_sequence(prompt_len: int) -> Sequence:
    params = SamplingParams(temperature=0, max_tokens=8)
    prompt = [1] * prompt_len
    return Sequence("fresh", Request(EngineRequest("fresh", prompt, params)), 0, list(prompt), prompt_len)


def test_a_draft_model_shorter_than_the_calibration_prompts_calibrates_within_its_length(tiny_models):
    target, _ = tiny_models
    loaded = load_model(target, "float32")
    proposer = DraftModelProposer(loaded.model, num_blocks=64, block_size=4, generator=torch.Generator(), max_model_len=40)
    assert proposer.draft_token_cost_s() > 0
    assert proposer.catch_up_cost_s(_fresh_sequence(30)) > 0  # catch-ups of 8 and 35 tokens timed: a line
    assert proposer.kv.num_free_blocks == 64


def test_a_model_in_ggml_blocks_drafts_within_one_weight_pass_and_decodes_as_plain(tmp_path):
    import numpy as np
    from gguf import GGMLQuantizationType

    from tests.models.test_gguf_loader import SHAPE, write_gguf

    folder = save_tiny_model("llama", tmp_path / "hf", **SHAPE)
    path = tmp_path / "q8.gguf"
    write_gguf(folder, path, GGMLQuantizationType.Q8_0, np.random.default_rng(0))
    options = dict(block_size=4, num_kv_blocks=64)
    spec = LLM(str(path), dtype="auto", speculative_method="ngram", **options)
    assert spec.engine.speculator.rows_per_pass == 8 and spec.engine.config.speculative.num_speculative_tokens == 8
    assert LLM(str(path), dtype="float32", speculative_method="ngram", **options).engine.speculator.rows_per_pass is None
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]  # a repeating prompt: the lookup drafts
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(path), dtype="auto", **options).generate([prompt], params)[0].outputs[0].token_ids
    assert spec.generate([prompt], params)[0].outputs[0].token_ids == plain
    decode_rows = [record.num_scheduled_tokens for record in spec.engine.step_records()[1:]]  # after the prompt's step
    assert max(decode_rows) > 1 and max(decode_rows) <= 8  # it drafted, never past one pass of 8 rows
