"""Parallel vs single-process parity: the reference is ember's own single-process engine.

Logits of every prompt position (all prompts in one mixed flat batch) within LOGIT_TOLERANCE,
greedy tokens identical, for the same checkpoint run whole in one process and split over ranks.
"""

from __future__ import annotations

import torch

from ember.engine.engine_request import EngineRequest
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from ember.parallel.volume import parallel_volume
from tests.parallel.split_sum_reference import split_row_parallel_sums

LOGIT_TOLERANCE = 1e-5
NUM_GENERATED = 24


def prompt_logits(llm: LLM, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits of every prompt position, all prompts in one flat batch; the requests are dropped after."""
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"logits-{i}", prompt, SamplingParams(max_tokens=1)))
    plan = engine.scheduler.schedule()
    assert [item.num_new_tokens for item in plan.scheduled] == [len(p) for p in prompts]
    logits = engine.runner.all_logits(plan)
    for i in range(len(prompts)):
        engine.abort_request(f"logits-{i}")
    engine.step()
    return list(logits.split([len(p) for p in prompts]))


def greedy_tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


def assert_parallel_matches(
    single: LLM, parallel: LLM, prompts: list[list[int]], tolerance: float = LOGIT_TOLERANCE
) -> float:
    """Logits within `tolerance` and greedy tokens identical; returns the largest logit difference."""
    worst = 0.0
    for ours, reference in zip(prompt_logits(parallel, prompts), prompt_logits(single, prompts), strict=True):
        worst = max(worst, (ours - reference).abs().max().item())
    assert worst <= tolerance, f"max abs logit difference {worst}"
    assert greedy_tokens(parallel, prompts) == greedy_tokens(single, prompts)
    return worst


def assert_volume_matches_formula(parallel: LLM, prompts: list[list[int]]) -> None:
    """Bytes rank 0 sent in one forward pass over `prompts`, as counted, equal the mode's formula per token
    (per token of the batch padded to a multiple of the world size, for a sequence split)."""
    communicator = parallel.engine.workers.communicator
    communicator.stats.reset()
    prompt_logits(parallel, prompts)
    parallel_config = parallel.engine.config.parallel
    volume = parallel_volume(parallel.engine.model_config, parallel_config, element_bytes=4)
    num_tokens = volume.counted_tokens([sum(len(p) for p in prompts)], parallel_config.world_size)
    assert sum(communicator.stats.bytes_sent[kind] for kind in volume.kinds) == num_tokens * volume.bytes_per_token
    assert sum(communicator.stats.calls[kind] for kind in volume.kinds) == volume.calls_per_forward


def assert_only_the_all_reduce_reorders(single: LLM, parallel: LLM, prompts: list[list[int]], tolerance: float = 0.0) -> None:
    """Within `tolerance` (0: bit-identical) of one process whose row layers add the ranks' partial sums
    (split_sum_reference; `single`'s model is rebuilt that way)."""
    split_row_parallel_sums(single.engine.runner.model, world_size=2)
    for ours, reference in zip(prompt_logits(parallel, prompts), prompt_logits(single, prompts), strict=True):
        assert (ours - reference).abs().max().item() <= tolerance
