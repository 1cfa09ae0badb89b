"""Invariants of a real LLMEngine under random add / step / abort / fork traffic on a tiny pool.

A tiny random Llama (no tokenizer, so nothing stops early: every sequence runs to max_tokens)
serves random seeded requests, some sharing prompt prefixes, some with n > 1, while steps and
aborts interleave. After every operation: no block leaks, no block shared without a holder,
every live sequence in exactly one queue, the budget and seat limits kept. At the end: the pool
is full again, every request produced exactly one finished output with all its tokens, and
every completion equals the one its prompt and seed give when run alone on a roomy pool (so
forks, copy-on-write, prefix hits and preemption changed no token).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.request import SequenceStatus
from ember.engine.sampling_params import SamplingParams
from tests.model_factory import save_tiny_model

BLOCK_SIZE = 4
SHARED_HEADS = (list(range(40, 56)), list(range(200, 216)))  # prompts drawn from these hit the prefix cache
MAX_DRAIN_STEPS = 300
SEED = 7  # sibling i of a request samples from seed + i, whatever shares its batch


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@dataclass(frozen=True)
class Add:
    prompt: tuple[int, ...]
    max_tokens: int
    n: int
    priority: int


@dataclass(frozen=True)
class Step:
    pass


@dataclass(frozen=True)
class Abort:
    pick: int  # index into the requests added so far, modulo their count


shared_prompts = st.builds(
    lambda head, length, tail: tuple(SHARED_HEADS[head][:length]) + tuple(tail),
    st.integers(0, 1),
    st.integers(4, 14),
    st.lists(st.integers(0, 319), max_size=3),
)
prompts = st.lists(st.integers(0, 319), min_size=1, max_size=10).map(tuple)
adds = st.builds(
    Add,
    prompt=st.one_of(shared_prompts, shared_prompts, prompts),
    max_tokens=st.integers(2, 6),
    n=st.sampled_from([1, 1, 2, 3]),
    priority=st.integers(0, 2),
)
later_operations = st.one_of(adds, st.just(Step()), st.just(Step()), st.builds(Abort, st.integers(0, 20)))
operations = st.tuples(
    st.lists(adds, min_size=3, max_size=6),  # a busy start, so pools fill up and forks collide
    st.lists(later_operations, max_size=16),
).map(lambda parts: parts[0] + parts[1])
configs = st.fixed_dictionaries(
    {
        "num_kv_blocks": st.integers(5, 8),
        "max_num_batched_tokens": st.integers(6, 24),
        "max_num_seqs": st.integers(2, 4),
        "enable_chunked_prefill": st.booleans(),
        "enable_prefix_caching": st.sampled_from([True, True, False]),
    }
)


class Harness:
    """The engine, the requests it accepted, and every output it gave back."""

    def __init__(self, model: Path, config: dict, speculative: SpeculativeConfig | None = None) -> None:
        self.scheduler_config = SchedulerConfig(
            config["max_num_batched_tokens"], config["max_num_seqs"], config["enable_chunked_prefill"]
        )
        cache = CacheConfig(
            BLOCK_SIZE, config["num_kv_blocks"], enable_prefix_caching=config["enable_prefix_caching"]
        )
        self.engine = LLMEngine(
            EngineConfig(model=str(model), cache=cache, scheduler=self.scheduler_config,
                         speculative=speculative or SpeculativeConfig())
        )
        self.added: dict[str, SamplingParams] = {}
        self.prompts: dict[str, tuple[int, ...]] = {}
        self.aborted: set[str] = set()
        self.finished_outputs: Counter[str] = Counter()
        self.tokens: dict[tuple[str, int], list[int]] = {}

    def add(self, op: Add) -> None:
        request_id = f"r{len(self.added)}"
        # n is capped at max_num_seqs: a forking request with more siblings than seats can
        # never be admitted (RequestLimits.check refuses it).
        n = min(op.n, self.scheduler_config.max_num_seqs)
        params = SamplingParams(n=n, max_tokens=op.max_tokens, seed=SEED)
        try:
            self.engine.add_request(EngineRequest(request_id, list(op.prompt), params, priority=op.priority))
        except ValueError:
            assert request_id not in self.engine.requests
            return
        self.added[request_id] = params
        self.prompts[request_id] = op.prompt

    def abort(self, op: Abort) -> None:
        if not self.added:
            return
        request_id = list(self.added)[op.pick % len(self.added)]
        if request_id in self.engine.requests:
            self.aborted.add(request_id)
        self.engine.abort_request(request_id)

    def step(self) -> None:
        num_steps = self.engine.stats().num_steps
        for output in self.engine.step():
            assert self.finished_outputs[output.request_id] == 0, f"{output.request_id} after it finished"
            self.finished_outputs[output.request_id] += int(output.finished)
            for completion in output.outputs:
                key = (output.request_id, completion.index)
                self.tokens.setdefault(key, []).extend(completion.token_ids)
        if self.engine.stats().num_steps > num_steps:
            record = self.engine.step_records()[-1]
            assert record.num_scheduled_tokens <= self.scheduler_config.max_num_batched_tokens

    def check_invariants(self) -> None:
        check_blocks(self.engine)
        check_queues(self.engine)
        assert len(self.engine.scheduler.running) <= self.scheduler_config.max_num_seqs

    def check_all_done(self) -> None:
        stats = self.engine.stats()
        assert stats.num_free_blocks == stats.num_total_blocks
        assert (stats.num_running, stats.num_waiting) == (0, 0)
        assert self.engine.requests == {}
        assert self.finished_outputs == Counter({request_id: 1 for request_id in self.added})
        for request_id, params in self.added.items():
            if request_id in self.aborted:
                continue
            for index in range(params.n):
                assert len(self.tokens[(request_id, index)]) == params.max_tokens, (request_id, index)

    def check_against_solo_runs(self, model: Path) -> None:
        """Each completion equals (aborted: begins) the same prompt and seed run without sharing.

        The reference runs every sibling as its own n=1 request on a pool with room for all,
        prefix caching off: no fork, no copy-on-write, no prefix hit, no preemption.
        """
        cache = CacheConfig(BLOCK_SIZE, 256, enable_prefix_caching=False)
        scheduler = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=128)
        reference = LLMEngine(EngineConfig(model=str(model), cache=cache, scheduler=scheduler))
        for request_id, params in self.added.items():
            for index in range(params.n):
                solo = SamplingParams(max_tokens=params.max_tokens, seed=SEED + index)
                reference.add_request(EngineRequest(f"{request_id}/{index}", list(self.prompts[request_id]), solo))
        expected: dict[str, list[int]] = {}
        while reference.has_unfinished_requests():
            for output in reference.step():
                expected.setdefault(output.request_id, []).extend(output.outputs[0].token_ids)
        assert reference.stats().num_preemptions == 0
        for (request_id, index), tokens in self.tokens.items():
            solo_tokens = expected[f"{request_id}/{index}"]
            assert tokens == solo_tokens[: len(tokens)], (request_id, index)


def held_block_ids(engine: LLMEngine, seq_id: str) -> list[int] | None:
    """The block ids a sequence holds, or None when it has no block table."""
    try:
        return engine.kv.block_table(seq_id).block_ids
    except KeyError:
        return None


def check_blocks(engine: LLMEngine) -> None:
    """Every reference belongs to a live running sequence, every unreferenced block is free."""
    pool = engine.kv.pool
    holders: Counter[int] = Counter()
    for seq in engine.scheduler.running:
        block_ids = held_block_ids(engine, seq.seq_id)
        assert block_ids is not None, f"running {seq.seq_id} has no block table"
        assert len(block_ids) * BLOCK_SIZE >= seq.num_computed_tokens
        holders.update(block_ids)
    assert {block.block_id: block.ref_count for block in pool.blocks if block.ref_count} == dict(holders)
    free_ids = pool.free_queue.block_ids()
    assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks
    assert set(free_ids) == {block.block_id for block in pool.blocks if block.ref_count == 0}
    for block_hash, block in pool.cached.items():
        assert block.block_hash == block_hash


def check_queues(engine: LLMEngine) -> None:
    """Each unfinished sequence of a live request is in exactly one queue, with that status."""
    scheduler = engine.scheduler
    queued = Counter(id(seq) for seq in scheduler.running + scheduler.waiting)
    assert all(count == 1 for count in queued.values()), "a sequence is queued twice"
    live = [seq for request in engine.requests.values() for seq in request.sequences if not seq.is_finished]
    assert set(queued) == {id(seq) for seq in live}
    for seq in scheduler.running:
        assert seq.status is SequenceStatus.RUNNING
    for seq in scheduler.waiting:
        assert seq.status is SequenceStatus.WAITING
        assert seq.num_computed_tokens == 0
        assert held_block_ids(engine, seq.seq_id) is None, f"waiting {seq.seq_id} holds blocks"


HEAD = tuple(SHARED_HEADS[0])
BUSY_TIGHT_POOL = (  # preemption, prefix hits, forks with copy-on-write, an abort: every run
    dict(num_kv_blocks=6, max_num_batched_tokens=8, max_num_seqs=4, enable_chunked_prefill=True,
         enable_prefix_caching=True),
    [Add(HEAD[:10], 6, 2, 0), Add(HEAD[:12], 6, 1, 0), Add(tuple(range(300, 309)), 4, 3, 1),
     Step(), Step(), Step(), Add(HEAD[:14], 3, 1, 0), Step(), Abort(1), Step(), Step(),
     Add(HEAD[:9], 2, 2, 2)],
)
WHOLE_PROMPTS_ONLY = (
    dict(num_kv_blocks=5, max_num_batched_tokens=16, max_num_seqs=3, enable_chunked_prefill=False,
         enable_prefix_caching=True),
    [Add(HEAD[:9], 5, 3, 0), Add(HEAD[:10], 4, 1, 0), Add(HEAD[:4], 6, 1, 0), Step(),
     Add(HEAD[:11], 3, 2, 0), Abort(3)],
)


@settings(max_examples=15, deadline=None)
@example(config=BUSY_TIGHT_POOL[0], ops=BUSY_TIGHT_POOL[1])
@example(config=WHOLE_PROMPTS_ONLY[0], ops=WHOLE_PROMPTS_ONLY[1])
@given(config=configs, ops=operations)
def test_no_block_leaks_and_no_request_lost_under_random_traffic(
    tiny_llama: Path, config: dict, ops: list
) -> None:
    harness = Harness(tiny_llama, config)

    for op in ops:
        if isinstance(op, Add):
            harness.add(op)
        elif isinstance(op, Abort):
            harness.abort(op)
        else:
            harness.step()
        harness.check_invariants()

    for _ in range(MAX_DRAIN_STEPS):
        if not harness.engine.has_unfinished_requests():
            break
        harness.step()
        harness.check_invariants()
    assert not harness.engine.has_unfinished_requests(), "the engine stopped making progress"
    harness.check_all_done()
    harness.check_against_solo_runs(tiny_llama)
    stats = harness.engine.stats()
    event(f"preempted: {stats.num_preemptions > 0}")
    event(f"prefix hit: {stats.prefix_cache_hits > 0}")
    event(f"forked: {any(params.n > 1 for params in harness.added.values())}")
    event(f"aborted a live request: {bool(harness.aborted)}")


def test_a_request_with_more_siblings_than_seats_is_refused(tiny_llama: Path) -> None:
    scheduler = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2)
    config = EngineConfig(model=str(tiny_llama), cache=CacheConfig(BLOCK_SIZE, 16), scheduler=scheduler)
    engine = LLMEngine(config)

    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.add_request(EngineRequest("r", [1, 2, 3, 4, 5], SamplingParams(n=3, max_tokens=2)))


@settings(max_examples=10, deadline=None)
@example(config=BUSY_TIGHT_POOL[0], ops=BUSY_TIGHT_POOL[1], num_speculative_tokens=3)
@given(config=configs, ops=operations, num_speculative_tokens=st.integers(1, 4))
def test_speculation_leaks_no_block_and_loses_no_request_under_random_traffic(
    tiny_llama: Path, config: dict, ops: list, num_speculative_tokens: int
) -> None:
    """The same traffic with n-gram drafts verified and rolled back every step (random tiny models repeat
    themselves, so drafts are proposed and some kept)."""
    speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=num_speculative_tokens, ngram_min=1)
    harness = Harness(tiny_llama, config, speculative)
    for op in ops:
        if isinstance(op, Add):
            harness.add(op)
        elif isinstance(op, Abort):
            harness.abort(op)
        else:
            harness.step()
        harness.check_invariants()
    for _ in range(MAX_DRAIN_STEPS):
        if not harness.engine.has_unfinished_requests():
            break
        harness.step()
        harness.check_invariants()
    assert not harness.engine.has_unfinished_requests(), "the engine stopped making progress"
    harness.check_all_done()
    event(f"drafted {harness.engine.stats().spec_draft_tokens_total > 0}")
