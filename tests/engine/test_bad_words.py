"""vLLM's bad_words and allowed_token_ids: what the output may not spell, and the only tokens it may use."""

from __future__ import annotations

import pytest

from ember.engine.bad_words import bad_word_token_ids, banned_by_bad_words
from ember.engine.engine_request import EngineRequest
from ember.engine.rejection import RequestRejected
from ember.engine.sampling_params import SamplingParams
from ember.tokenizers import load
from tests.engine.stories import run_to_completion, stories_llm


def test_a_one_token_word_is_always_banned_and_a_longer_one_only_once_begun():
    words = ((7,), (3, 4, 5))
    assert banned_by_bad_words(words, []) == {7}
    assert banned_by_bad_words(words, [1, 3]) == {7}
    assert banned_by_bad_words(words, [3, 4]) == {7, 5}
    assert banned_by_bad_words(words, [4, 3, 4]) == {7, 5}
    assert banned_by_bad_words(((3, 4, 5),), [4]) == set()


def _spelled(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def test_a_word_is_spelled_as_written_and_after_a_space_where_that_is_another_token(shared_dir):
    """GPT-2 spells "dog" and " dog" as two different single tokens: both are banned."""
    tokenizer = load(shared_dir / "tokenizers" / "gpt2")
    plain, spaced = _spelled(tokenizer, "dog"), _spelled(tokenizer, " dog")
    assert len(plain) == len(spaced) == 1 and plain != spaced
    assert bad_word_token_ids(tokenizer, ["  dog"]) == (plain, spaced)  # leading spaces are dropped first


def test_a_spaced_spelling_of_another_length_is_not_added(stories_dir):
    """The stories tokenizer writes the space as a token of its own before "Lily": only "Lily" itself is banned."""
    tokenizer = stories_llm(stories_dir, block_size=4, num_kv_blocks=64).tokenizer
    assert len(_spelled(tokenizer, " Lily")) > len(_spelled(tokenizer, "Lily"))
    assert bad_word_token_ids(tokenizer, ["Lily"]) == (_spelled(tokenizer, "Lily"),)


def _contains(tokens: list[int], word: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(word)]) == word for i in range(len(tokens) - len(word) + 1))


@pytest.mark.parametrize("speculative_method", [None, "ngram"])
def test_bad_words_keep_greedy_output_off_words_it_would_write(stories_dir, speculative_method):
    options = {"speculative_method": speculative_method, "num_speculative_tokens": 4} if speculative_method else {}
    llm = stories_llm(stories_dir, block_size=4, num_kv_blocks=256, **options)
    prompt = llm.tokenizer.encode("Once upon a time there was a little girl named Lily. She", add_special_tokens=True)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    free = run_to_completion(llm, {"free": (prompt, greedy)})["free"].outputs[0]
    words = ["ball", "park. One"]
    assert all(word in free.text for word in words)  # the words the unconstrained output writes
    banned = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, bad_words=words)
    held = run_to_completion(llm, {"held": (prompt, banned), "free": (prompt, greedy)})
    tokens = held["held"].outputs[0].token_ids
    assert not any(_contains(tokens, spelling) for spelling in bad_word_token_ids(llm.tokenizer, words))
    assert held["free"].outputs[0].token_ids == free.token_ids  # a request beside it is untouched
    assert llm.engine.kv.num_free_blocks == 256


def test_allowed_token_ids_are_the_only_ones_sampled(stories_dir):
    llm = stories_llm(stories_dir, block_size=4, num_kv_blocks=256)
    prompt = llm.tokenizer.encode("One day, a bird", add_special_tokens=True)
    free = SamplingParams(temperature=1.0, seed=1, max_tokens=60, ignore_eos=True)
    seen = sorted(set(run_to_completion(llm, {"a": (prompt, free)})["a"].outputs[0].token_ids))
    allowed = seen[::2]  # tokens it does write, half of them
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=60, ignore_eos=True, allowed_token_ids=allowed)
    tokens = run_to_completion(llm, {"a": (prompt, params)})["a"].outputs[0].token_ids
    assert set(tokens) <= set(allowed) and len(set(tokens)) > 1


def test_allowed_token_ids_outside_the_vocabulary_are_refused(stories_dir):
    llm = stories_llm(stories_dir, block_size=4, num_kv_blocks=64)
    with pytest.raises(RequestRejected, match="allowed_token_ids") as raised:
        llm.engine.add_request(EngineRequest("a", [1, 2], SamplingParams(allowed_token_ids=[1, 512])))
    assert raised.value.param == "allowed_token_ids"
