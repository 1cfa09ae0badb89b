"""The radix prefix cache end to end on stories260K: the same greedy tokens as the hash cache and no cache, no leaked block."""

from __future__ import annotations

import pytest

from ember.engine.engine_request import EngineRequest
from ember.engine.sampling_params import SamplingParams
from tests.engine.stories import run_to_completion, stories_llm

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
STORY = ("Once upon a time there was a little girl named Lily who loved to play in the park with her big red ball. "
         "One day she saw a dog. The dog was sad because it had lost its bone.")


def _rounds(llm) -> list[dict[str, list[int]]]:
    """Three rounds of prompts that extend and leave each other at token counts no block size divides."""
    story = llm.tokenizer.encode(STORY, add_special_tokens=True)
    twist = llm.tokenizer.encode(" Then a big bird came.", add_special_tokens=False)
    return [
        {"first": story[:23], "other": story[:13] + twist},
        {"turn-2": story[:23] + twist + story[30:37], "sibling": story[:21] + twist, "again": story[:13] + twist + twist},
        {"turn-3": story[:23] + twist + story[30:41] + twist, "short": story[:6]},
    ]


def _outputs(llm, rounds: list[dict[str, list[int]]]) -> dict[str, list[int]]:
    got = {}
    for prompts in rounds:
        results = run_to_completion(llm, {name: (prompt, GREEDY) for name, prompt in prompts.items()})
        got.update({name: result.outputs[0].token_ids for name, result in results.items()})
    return got


def _assert_every_block_back(llm) -> None:
    kv = llm.engine.kv
    assert kv.num_free_blocks == kv.num_blocks
    assert all(block.ref_count == 0 for block in kv.pool.blocks)


@pytest.mark.parametrize("block_size", [4, 16])
def test_radix_hash_and_no_cache_give_the_same_greedy_tokens_and_radix_serves_more(stories_dir, block_size):
    llms = {
        "radix": stories_llm(stories_dir, block_size=block_size, num_kv_blocks=128, prefix_cache="radix"),
        "hash": stories_llm(stories_dir, block_size=block_size, num_kv_blocks=128, prefix_cache="hash"),
        "off": stories_llm(stories_dir, block_size=block_size, num_kv_blocks=128, enable_prefix_caching=False),
    }
    rounds = _rounds(llms["off"])
    outputs = {name: _outputs(llm, rounds) for name, llm in llms.items()}
    assert outputs["radix"] == outputs["off"]
    assert outputs["hash"] == outputs["off"]
    hits = {name: llm.engine.stats().prefix_cache_hits for name, llm in llms.items()}
    assert hits["radix"] > hits["hash"] > 0 == hits["off"]
    for llm in llms.values():
        _assert_every_block_back(llm)


def test_preemption_and_aborts_with_the_radix_cache_keep_greedy_tokens_and_leak_nothing(stories_dir):
    roomy = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, enable_prefix_caching=False)
    tight = stories_llm(stories_dir, block_size=4, num_kv_blocks=30, prefix_cache="radix")
    rounds = _rounds(roomy)
    prompts = {name: prompt for prompts in rounds for name, prompt in prompts.items()}
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = {name: run_to_completion(roomy, {name: (prompt, params)})[name].outputs[0].token_ids for name, prompt in prompts.items()}
    engine = tight.engine
    engine.add_request(EngineRequest("aborted", prompts["turn-3"], params))
    for _ in range(3):
        engine.step()
    engine.abort_request("aborted")
    while engine.has_unfinished_requests():
        engine.step()
    together = run_to_completion(tight, {name: (prompt, params) for name, prompt in prompts.items()})
    assert engine.stats().num_preemptions > 0
    assert {name: result.outputs[0].token_ids for name, result in together.items()} == expected
    _assert_every_block_back(tight)
