"""A real tiny model with a real tokenizer (stories260K), for engine behaviour tests."""

from __future__ import annotations

from pathlib import Path

from ember.engine.engine_request import EngineRequest
from ember.engine.outputs import OutputAccumulator, RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM


def stories_llm(stories_dir: Path, **options) -> LLM:
    return LLM(str(stories_dir / "stories260K.bin"), tokenizer=str(stories_dir / "tok512.bin"), **options)


def run_to_completion(llm: LLM, requests: dict[str, tuple[list[int], object]]) -> dict[str, RequestOutput]:
    """Add every request to the engine at once, step until all finish, return accumulated outputs."""
    engine = llm.engine
    accumulators = {}
    for request_id, (prompt_ids, params) in requests.items():
        engine.add_request(EngineRequest(request_id, prompt_ids, params))
        accumulators[request_id] = OutputAccumulator(request_id, params.n)
    while engine.has_unfinished_requests():
        for output in engine.step():
            accumulators[output.request_id].add(output)
    return {request_id: acc.result() for request_id, acc in accumulators.items()}


STORY_PROMPTS = (
    "Once upon a time there was a little girl named Lily. She",
    "The cat sat on the mat. The cat sat on the",
    "One day, a bird",
)


def assert_mixed_batch_matches_plain(plain: LLM, spec: LLM, num_kv_blocks: int) -> None:
    """A batch mixing greedy prompts, a speculation opt-out, greedy forks (n=2) and a seeded sample: with `spec`'s
    speculation every greedy output is `plain`'s token for token, the sample runs to its length, drafts were kept,
    and every KV block comes back."""
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    requests = {str(i): (plain.tokenizer.encode(text, add_special_tokens=True), greedy) for i, text in enumerate(STORY_PROMPTS)}
    requests["opt-out"] = (requests["0"][0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, allow_speculation=False))
    requests["forks"] = (requests["1"][0], SamplingParams(n=2, temperature=0, max_tokens=30, ignore_eos=True))
    requests["sampled"] = (requests["2"][0], SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=25, ignore_eos=True))
    expected = run_to_completion(plain, requests)
    got = run_to_completion(spec, requests)
    stats = spec.engine.stats()
    for request_id in requests:
        if request_id != "sampled":
            assert [c.token_ids for c in got[request_id].outputs] == [c.token_ids for c in expected[request_id].outputs]
    assert len(got["sampled"].outputs[0].token_ids) == 25
    assert stats.spec_verifications_total > 0 and stats.spec_accepted_tokens_total > 0
    assert stats.generation_tokens_total == plain.engine.stats().generation_tokens_total
    assert spec.engine.kv.num_free_blocks == num_kv_blocks
