"""Jump-forward on a real tiny model (stories260K): tokens a constraint forces are appended without a model step.

Given a constraint with long forced runs, when a greedy request runs with and without jump-forward, then every backend
gives text of the constraint's language in fewer steps; forced tokens count against max_tokens and a stop string inside
them ends the reply exactly where sampled tokens would."""

from __future__ import annotations

import re

import pytest

from ember.engine.sampling_params import SamplingParams
from ember.engine.structured import StructuredOutput
from tests.engine.stories import run_to_completion, stories_llm

REGEX = "Once upon a time, there was a (cat|dog) named (Tom|Sue)\\."
GRAMMAR = 'root ::= "Once upon a time, there was a " ("cat" | "dog") " named " ("Tom" | "Sue") "."'


def _run(stories_dir, backend: str, jump_forward: bool, constraint: StructuredOutput, max_tokens: int = 60, **params):
    llm = stories_llm(stories_dir, structured_outputs_backend=backend, jump_forward=jump_forward)
    prompt = llm.tokenizer.encode("Lily", add_special_tokens=True)
    result = run_to_completion(llm, {"r": (prompt, SamplingParams(temperature=0, max_tokens=max_tokens, **params,
                                                                  structured_output=constraint))})  # fmt: skip
    return result["r"].outputs[0], llm.engine.num_steps


@pytest.mark.parametrize("backend", ["ember", "xgrammar", "llguidance"])
def test_each_backend_gives_its_language_in_fewer_steps(stories_dir, backend):
    if backend != "ember":
        pytest.importorskip(backend)
    constraint = StructuredOutput(regex=REGEX) if backend == "ember" else StructuredOutput(grammar=GRAMMAR)
    stepped, stepped_steps = _run(stories_dir, backend, False, constraint)
    jumped, jumped_steps = _run(stories_dir, backend, True, constraint)
    for output in (stepped, jumped):
        assert re.fullmatch(REGEX, output.text) and output.finish_reason == "stop", output.text
    assert jumped_steps < stepped_steps / 2, (jumped_steps, stepped_steps)


@pytest.mark.parametrize("backend", ["ember", "llguidance"])
def test_forced_tokens_meet_the_stop_checks_of_sampled_ones(stories_dir, backend):
    pytest.importorskip("llguidance")
    constraint = StructuredOutput(regex=REGEX) if backend == "ember" else StructuredOutput(grammar=GRAMMAR)
    stopped, _ = _run(stories_dir, backend, True, constraint, stop=["a time"])
    assert stopped.text == "Once upon " and stopped.finish_reason == "stop"
    cut, _ = _run(stories_dir, backend, True, constraint, max_tokens=3)
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length" and "Once upon a time".startswith(cut.text)
