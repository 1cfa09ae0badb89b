"""A real tiny model with a real tokenizer (stories260K), for engine behaviour tests."""

from __future__ import annotations

from pathlib import Path

from ember.engine.outputs import OutputAccumulator, RequestOutput
from ember.llm import LLM


def stories_llm(stories_dir: Path, **options) -> LLM:
    return LLM(str(stories_dir / "stories260K.bin"), tokenizer=str(stories_dir / "tok512.bin"), **options)


def run_to_completion(llm: LLM, requests: dict[str, tuple[list[int], object]]) -> dict[str, RequestOutput]:
    """Add every request to the engine at once, step until all finish, return accumulated outputs."""
    engine = llm.engine
    accumulators = {}
    for request_id, (prompt_ids, params) in requests.items():
        engine.add_request(request_id, prompt_ids, params)
        accumulators[request_id] = OutputAccumulator(request_id, params.n)
    while engine.has_unfinished_requests():
        for output in engine.step():
            accumulators[output.request_id].add(output)
    return {request_id: acc.result() for request_id, acc in accumulators.items()}
