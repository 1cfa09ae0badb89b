"""A request is checked in one place per rule: SamplingParams and EngineRequest check their own fields on
construction, RequestLimits what depends on the engine; each raises one RequestRejected naming the field."""

from __future__ import annotations

import pickle

import pytest

from ember.engine.engine_request import EngineRequest
from ember.engine.limits import RequestLimits
from ember.engine.rejection import RequestRejected
from ember.engine.sampling_params import SamplingParams
from ember.engine.structured import StructuredOutput

LIMITS = RequestLimits(vocab_size=100, max_model_len=64, num_kv_blocks=8, block_size=4, group_windows=(None,),
                       max_num_batched_tokens=64, max_num_seqs=4, enable_chunked_prefill=True)  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 0}, "n"), ({"n": 129}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10**7}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"), ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"temperature": -0.1}, "temperature"), ({"temperature": 2.01}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"stop": [""]}, "stop"), ({"stop": [str(i) for i in range(17)]}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"logprobs": 21}, "logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"), ({"logit_bias": {1: 101}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"), ({"bad_words": [" "]}, "bad_words"), ({"seed": 2**63}, "seed"),
    ({"embed": True}, "embed"),
])  # fmt: skip
def test_sampling_params_name_the_field_out_of_range(fields, param):
    with pytest.raises(RequestRejected) as raised:
        SamplingParams(**fields)
    assert raised.value.param == param and raised.value.code == "invalid_value"


def test_the_temperature_limit_is_openais_two_everywhere():
    assert SamplingParams(temperature=2.0).temperature == 2.0
    with pytest.raises(RequestRejected, match="from 0 to 2"):
        SamplingParams(temperature=2.5)


@pytest.mark.parametrize(("fields", "param", "mentions"), [
    ({"prompt_token_ids": []}, "prompt", "prompt is empty"),
    ({"prompt_token_ids": [1, "2"]}, "prompt", "'2' in it is not a token id"),
    ({"prompt_token_ids": [1, -3]}, "prompt", "-3 in it is not a token id"),
    ({"prompt_token_ids": [1, True]}, "prompt", "True in it"),
    ({"request_id": ""}, "request_id", "non-empty"),
    ({"priority": 1.5}, "priority", "integer"),
    ({"cache_salt": ""}, "cache_salt", "non-empty"),
    ({"cache_salt": "s" * 1025}, "cache_salt", "1024"),
])  # fmt: skip
def test_an_engine_request_names_the_field_it_refuses(fields, param, mentions):
    given = {"request_id": "r", "prompt_token_ids": [1, 2], **fields}
    with pytest.raises(RequestRejected, match=mentions) as raised:
        EngineRequest(**given)
    assert raised.value.param == param


def test_numpy_prompt_ids_become_plain_ints():
    import numpy as np

    request = EngineRequest("r", np.array([3, 4]))
    assert request.prompt_token_ids == [3, 4] and all(type(t) is int for t in request.prompt_token_ids)


@pytest.mark.parametrize(("prompt", "params", "param", "code"), [
    ([100], SamplingParams(), "prompt", "invalid_value"),
    ([1] * 64, SamplingParams(max_tokens=1), "prompt", "context_length_exceeded"),
    ([1] * 60, SamplingParams(max_tokens=5), "max_tokens", "context_length_exceeded"),
    ([1] * 4, SamplingParams(max_tokens=40), "max_tokens", "invalid_value"),  # 11 blocks of 4 > 8 in the cache
    ([1], SamplingParams(logit_bias={100: 1.0}), "logit_bias", "invalid_value"),
    ([1], SamplingParams(allowed_token_ids=[5, 100]), "allowed_token_ids", "invalid_value"),
    ([1], SamplingParams(n=5, max_tokens=1), "n", "invalid_value"),
])  # fmt: skip
def test_the_engines_limits_name_the_field_to_change(prompt, params, param, code):
    with pytest.raises(RequestRejected) as raised:
        LIMITS.check(EngineRequest("r", prompt, params))
    assert (raised.value.param, raised.value.code) == (param, code)


@pytest.mark.parametrize(("params", "param"), [
    (SamplingParams(bad_words=["dog"]), "bad_words"),
    (SamplingParams(structured_output=StructuredOutput(json_object=True)), "structured_output"),
])  # fmt: skip
def test_an_engine_without_a_tokenizer_refuses_what_needs_one(params, param):
    limits = RequestLimits(**{**LIMITS.__dict__, "has_tokenizer": False})
    with pytest.raises(RequestRejected, match="tokenizer") as raised:
        limits.check(EngineRequest("r", [1, 2], params))
    assert raised.value.param == param
    LIMITS.check(EngineRequest("r", [1, 2], params))  # the same request, where there is one


def test_a_rejection_keeps_its_field_and_code_across_a_process_boundary():
    copied = pickle.loads(pickle.dumps(RequestRejected("too long", "prompt", "context_length_exceeded")))
    assert (str(copied), copied.param, copied.code) == ("too long", "prompt", "context_length_exceeded")
