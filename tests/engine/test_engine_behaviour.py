"""Engine behaviour end to end on a real tiny model: caching, preemption, forks, seeds, stops, logprobs."""

from __future__ import annotations

import math

import pytest

from ember.engine.engine_request import EngineRequest
from ember.engine.sampling_params import SamplingParams
from tests.engine.stories import run_to_completion, stories_llm

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture
def llm(stories_dir):
    return stories_llm(stories_dir, block_size=16, num_kv_blocks=64)


def _prompt(llm, text: str) -> list[int]:
    return llm.tokenizer.encode(text, add_special_tokens=True)


def test_second_request_with_a_cached_64_token_prefix_computes_only_the_new_tokens(llm):
    prefix = _prompt(llm, "Once upon a time there was a little girl named Lily who loved to play in the park with her big red ball and her dog.")
    prefix = (prefix * 4)[:64]
    first = prefix + _prompt(llm, " She was happy.")[1:]
    second = prefix + _prompt(llm, " He was sad.")[1:]
    engine = llm.engine
    cold = run_to_completion(llm, {"cold": (second, GREEDY)})["cold"]
    engine.kv.pool.cached.clear()  # forget the cold run; only `first` may seed the cache
    for block in engine.kv.pool.blocks:
        block.block_hash = None
    run_to_completion(llm, {"first": (first, GREEDY)})
    before = engine.stats()
    warm = run_to_completion(llm, {"second": (second, GREEDY)})["second"]
    after = engine.stats()
    computed = after.computed_tokens_total - before.computed_tokens_total
    assert warm.num_cached_tokens == 64
    assert after.prefix_cache_hits - before.prefix_cache_hits == 64
    assert computed == len(second) - 64 + GREEDY.max_tokens - 1
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids


def test_a_cache_salt_shares_cached_prefixes_only_with_requests_of_the_same_salt(llm):
    prompt = (_prompt(llm, "Once upon a time there was a little girl named Lily who loved to play.") * 4)[:70]
    engine = llm.engine

    def cached_tokens(request_id: str, salt: str | None) -> int:
        engine.add_request(EngineRequest(request_id, prompt, GREEDY, cache_salt=salt))
        outputs = {}
        while engine.has_unfinished_requests():
            outputs.update({output.request_id: output for output in engine.step()})
        return outputs[request_id].num_cached_tokens

    assert cached_tokens("alice-1", "alice") == 0
    assert cached_tokens("bob-1", "bob") == 0  # the same prompt under another salt: nothing shared
    assert cached_tokens("plain-1", None) == 0  # nor without one
    assert cached_tokens("alice-2", "alice") == 64  # every full block of alice's prompt
    assert cached_tokens("plain-2", None) == 64


def test_prefix_caching_switched_off_computes_everything(stories_dir):
    llm = stories_llm(stories_dir, block_size=16, num_kv_blocks=64, enable_prefix_caching=False)
    prompt = _prompt(llm, "Once upon a time there was a little dog. " * 6)
    run_to_completion(llm, {"a": (prompt, GREEDY)})
    again = run_to_completion(llm, {"b": (prompt, GREEDY)})["b"]
    assert again.num_cached_tokens == 0
    assert llm.engine.stats().prefix_cache_hits == 0


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_preemption_when_the_pool_is_too_small_keeps_every_greedy_output(stories_dir, kv_cache_dtype):
    prompts = [_prompt(stories_llm(stories_dir), f"Once upon a time there was a {w}.") for w in ("cat", "dog", "bird", "fish", "king", "tree")]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    roomy = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, kv_cache_dtype=kv_cache_dtype)
    alone = [run_to_completion(roomy, {str(i): (p, params)})[str(i)].outputs[0].token_ids for i, p in enumerate(prompts)]
    tight = stories_llm(stories_dir, block_size=4, num_kv_blocks=30, enable_prefix_caching=False, kv_cache_dtype=kv_cache_dtype)
    together = run_to_completion(tight, {str(i): (p, params) for i, p in enumerate(prompts)})
    assert tight.engine.stats().num_preemptions > 0
    assert [together[str(i)].outputs[0].token_ids for i in range(len(prompts))] == alone
    assert tight.engine.kv.num_free_blocks == 30


def test_n_forks_share_the_prompt_and_copy_on_write_with_greedy_equal_outputs(llm):
    prompt = _prompt(llm, "Once upon a time there was a big")  # a partial last block is shared
    outputs = run_to_completion(llm, {"fork": (prompt, SamplingParams(n=3, temperature=0, max_tokens=16, ignore_eos=True))})
    single = run_to_completion(llm, {"one": (prompt, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))})
    completions = outputs["fork"].outputs
    assert [c.index for c in completions] == [0, 1, 2]
    assert all(c.token_ids == single["one"].outputs[0].token_ids for c in completions)
    assert llm.engine.kv.num_free_blocks == 64


def test_n_seeded_samples_differ_from_each_other_and_repeat_with_the_same_seed(llm):
    prompt = _prompt(llm, "Once upon a time")
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=20, ignore_eos=True)
    first = run_to_completion(llm, {"a": (prompt, params)})["a"]
    second = run_to_completion(llm, {"b": (prompt, params)})["b"]
    texts = [c.token_ids for c in first.outputs]
    assert len({tuple(t) for t in texts}) > 1
    assert texts == [c.token_ids for c in second.outputs]


def test_a_seeded_request_samples_the_same_whatever_shares_its_batch(llm):
    prompt = _prompt(llm, "The little bird")
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=123, max_tokens=24, ignore_eos=True)
    alone = run_to_completion(llm, {"s": (prompt, seeded)})["s"].outputs[0].token_ids
    noise = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    crowd = {f"n{i}": (_prompt(llm, f"A story number {i} about"), noise) for i in range(5)}
    crowd["s"] = (prompt, seeded)
    together = run_to_completion(llm, crowd)["s"].outputs[0].token_ids
    assert together == alone


def test_stop_string_ends_the_text_before_it_even_across_token_boundaries(llm):
    prompt = [llm.tokenizer.bos_id]
    full = run_to_completion(llm, {"full": (prompt, SamplingParams(temperature=0, max_tokens=60))})["full"].outputs[0].text
    stop = "girl named"  # spans several tokens of the greedy story
    assert stop in full
    stopped = run_to_completion(llm, {"s": (prompt, SamplingParams(temperature=0, max_tokens=60, stop=[stop]))})["s"].outputs[0]
    assert stopped.text == full[: full.index(stop)]
    assert stopped.finish_reason == "stop"
    assert stopped.stop_reason == stop


def test_streamed_deltas_reassemble_to_the_text_and_never_show_a_stop_string_prefix(llm):
    prompt = [llm.tokenizer.bos_id]
    params = SamplingParams(temperature=0, max_tokens=60, stop=["Lily. She"])
    llm.engine.add_request(EngineRequest("stream", prompt, params))
    pieces = []
    while llm.engine.has_unfinished_requests():
        pieces.extend(o.outputs[0].text for o in llm.engine.step())
    text = "".join(pieces)
    assert text.endswith("named ")
    assert "Lily" not in text


def test_stop_token_ids_and_max_tokens_set_the_finish_reason(llm):
    prompt = [llm.tokenizer.bos_id]
    greedy = run_to_completion(llm, {"g": (prompt, SamplingParams(temperature=0, max_tokens=10))})["g"].outputs[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 10
    stop_id = greedy.token_ids[4]
    stopped = run_to_completion(llm, {"s": (prompt, SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id]))})["s"].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id
    assert stopped.token_ids == greedy.token_ids[: greedy.token_ids.index(stop_id) + 1]


def test_min_tokens_forbids_stop_tokens_until_reached(llm):
    prompt = [llm.tokenizer.bos_id]
    greedy = run_to_completion(llm, {"g": (prompt, SamplingParams(temperature=0, max_tokens=12))})["g"].outputs[0]
    stop_id = greedy.token_ids[3]
    params = SamplingParams(temperature=0, max_tokens=12, min_tokens=8, stop_token_ids=[stop_id])
    forced = run_to_completion(llm, {"m": (prompt, params)})["m"].outputs[0]
    assert len(forced.token_ids) >= 8
    assert stop_id not in forced.token_ids[:7]
    assert forced.token_ids[:3] == greedy.token_ids[:3]


def test_logprobs_rank_the_greedy_token_first_with_its_alternatives(llm):
    prompt = _prompt(llm, "Once upon a time")
    out = run_to_completion(llm, {"l": (prompt, SamplingParams(temperature=0, max_tokens=8, logprobs=3))})["l"].outputs[0]
    assert len(out.logprobs) == 8
    for token_id, position in zip(out.token_ids, out.logprobs, strict=True):
        chosen = position[token_id]
        assert chosen.rank == 1
        assert list(position)[0] == token_id and len(position) == 3
        assert all(entry.logprob <= chosen.logprob for entry in position.values())
        assert sum(math.exp(entry.logprob) for entry in position.values()) <= 1.0 + 1e-5
    assert out.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in zip(out.token_ids, out.logprobs, strict=True)))


def test_prompt_logprobs_cover_every_prompt_token_but_the_first(stories_dir):
    llm = stories_llm(stories_dir, block_size=4, num_kv_blocks=64, max_num_batched_tokens=5)
    prompt = _prompt(llm, "Once upon a time there was a little girl")
    out = run_to_completion(llm, {"p": (prompt, SamplingParams(max_tokens=1, prompt_logprobs=2))})["p"]
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(prompt)
    assert all(prompt[i] in out.prompt_logprobs[i] for i in range(1, len(prompt)))


def test_abort_returns_every_block_to_the_pool(llm):
    engine = llm.engine
    engine.add_request(EngineRequest("x", _prompt(llm, "Once upon a time " * 10), GREEDY))
    engine.add_request(EngineRequest("y", _prompt(llm, "A dog ran"), SamplingParams(n=2, temperature=1.0, max_tokens=50)))
    for _ in range(3):
        engine.step()
    assert engine.kv.num_free_blocks < 64
    engine.abort_request("x")
    engine.abort_request("y")
    final = engine.step()
    assert {o.request_id for o in final} == {"x", "y"}
    assert all(c.finish_reason == "abort" for o in final for c in o.outputs)
    assert engine.kv.num_free_blocks == 64 and not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("prompt_length", "params", "message"),
    [
        (0, SamplingParams(), "prompt is empty"),
        (600, SamplingParams(), "context window"),
        (500, SamplingParams(max_tokens=100), "lower max_tokens"),
    ],
)
def test_requests_that_cannot_run_are_refused_with_a_clear_message(llm, prompt_length, params, message):
    with pytest.raises(ValueError, match=message):
        llm.engine.add_request(EngineRequest("bad", [5] * prompt_length, params))
    assert not llm.engine.has_unfinished_requests()


def test_a_llama2c_story_ends_where_run_c_stops_at_bos(llm):
    bos = llm.tokenizer.bos_id
    ended = run_to_completion(llm, {"e": ([bos], SamplingParams(temperature=0, max_tokens=400))})["e"].outputs[0]
    ignored = run_to_completion(llm, {"i": ([bos], SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))})["i"].outputs[0]
    assert ended.finish_reason == "stop" and ended.token_ids[-1] == bos
    assert ignored.finish_reason == "length"
    assert ignored.token_ids[: len(ended.token_ids)] == ended.token_ids


def test_prompts_as_text_ids_numpy_ids_or_prompt_dicts_give_the_same_greedy_output(llm):
    import numpy as np

    ids = _prompt(llm, "Once upon a time")
    forms = ["Once upon a time", ids, np.array(ids), {"prompt": "Once upon a time"}, {"prompt_token_ids": ids}]
    outputs = [llm.generate(form, GREEDY)[0] for form in forms]
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1
    assert [o.prompt_token_ids for o in outputs] == [ids] * len(forms)
    batched = llm.generate([{"prompt": "Once upon a time"}, ids], GREEDY)
    assert [o.outputs[0].token_ids for o in batched] == [outputs[0].outputs[0].token_ids] * 2


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([5, "6", 7], "'6' in it is not a token id"),
        ([5, 2.5], "2.5 in it is not a token id"),
        ({"text": "hi"}, "holds 'prompt' .text. or 'prompt_token_ids'"),
        ({"prompt": "hi", "multi_modal_data": {"image": object()}}, "multi_modal_data .images, audio. cannot"),
        ([5, 10**9], "from 0 to 511"),
    ],
)
def test_a_batch_with_one_bad_prompt_is_refused_whole_and_leaves_nothing_queued(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([[5, 6, 7], prompt], GREEDY)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.kv.num_free_blocks == 64
