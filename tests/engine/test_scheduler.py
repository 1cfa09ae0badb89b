"""The scheduler over a real KV cache manager, with hand-made requests and a fake model step.

`Bench.step()` plans one step and completes it the way LLMEngine._process does: computed
tokens advance, a sequence that reaches its end samples one token (1000, 1001, ...), a
fork-pending sequence forks its siblings, and a sequence that reached max_tokens finishes.
Block size 4 and a handful of blocks; plans are compared as exact {seq_id: tokens} dicts.
"""

from __future__ import annotations

import itertools

from ember.engine.config import SchedulerConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.lora_request import LoRARequest
from ember.engine.request import Request, Sequence, SequenceStatus, make_sequence
from ember.engine.sampling_params import SamplingParams
from ember.engine.scheduler import Scheduler, SchedulerOutput
from ember.kv.cache_manager import BlockCopy, KVCacheManager

BLOCK_SIZE = 4


class Bench:
    """A scheduler, its cache manager, and the bookkeeping of a fake engine."""

    def __init__(
        self,
        num_blocks: int = 16,
        max_num_batched_tokens: int = 16,
        max_num_seqs: int = 8,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = False,
        max_loras: int | None = None,
    ) -> None:
        config = SchedulerConfig(max_num_batched_tokens, max_num_seqs, enable_chunked_prefill)
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching)
        self.scheduler = Scheduler(config, self.kv, max_loras)
        self.requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._tokens = itertools.count(1000)

    def add(
        self, request_id: str, prompt: list[int], max_tokens: int = 8, n: int = 1, priority: int = 0, adapter: int | None = None
    ) -> Request:
        params = SamplingParams(n=n, max_tokens=max_tokens)
        arrival_index = next(self._arrivals)
        lora = None if adapter is None else LoRARequest(f"adapter{adapter}", adapter, f"/adapters/{adapter}")
        asked = EngineRequest(request_id, list(prompt), params, priority=priority, lora_request=lora)
        request = Request(asked, arrival_index=arrival_index)
        forks = n > 1 and len(prompt) > 1
        request.sequences = [make_sequence(request, i, None, prompt) for i in range(1 if forks else n)]
        request.sequences[0].fork_pending = forks
        self.requests[request_id] = request
        for seq in request.sequences:
            self.scheduler.add_sequence(seq)
        return request

    def seq(self, seq_id: str) -> Sequence:
        request_id = seq_id.split("#")[0]
        return next(s for s in self.requests[request_id].sequences if s.seq_id == seq_id)

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        for item in out.scheduled:
            seq, samples = item.seq, item.samples
            seq.num_computed_tokens += item.num_new_tokens
            if seq.fork_pending and seq.num_computed_tokens == seq.compute_target:
                self._fork(seq)
            if samples:
                seq.token_ids.append(next(self._tokens))
                if seq.num_output_tokens >= seq.params.max_tokens:
                    seq.finish_reason = "length"
                    self.scheduler.finish(seq)
        return out

    def _fork(self, parent: Sequence) -> None:
        parent.fork_pending = False
        request = parent.request
        children = [make_sequence(request, i, None, parent.token_ids) for i in range(1, request.params.n)]
        request.sequences.extend(children)
        self.scheduler.fork(parent, children)

    def run_until_idle(self, max_steps: int = 200) -> list[SchedulerOutput]:
        plans = []
        while self.scheduler.has_work:
            plans.append(self.step())
            assert len(plans) <= max_steps, "the scheduler made no progress"
        return plans


def plan(out: SchedulerOutput) -> dict[str, int]:
    return {item.seq.seq_id: item.num_new_tokens for item in out.scheduled}


def ids(seqs: list[Sequence]) -> list[str]:
    return [seq.seq_id for seq in seqs]


def prompt(length: int, start: int = 0) -> list[int]:
    return list(range(start, start + length))


# -- LoRA adapters ------------------------------------------------------------------------------


def test_a_request_of_a_third_adapter_waits_until_one_of_two_slots_frees_and_the_queue_keeps_its_order() -> None:
    bench = Bench(max_num_batched_tokens=32, max_loras=2)
    bench.add("a", prompt(4), max_tokens=2, adapter=1)
    bench.add("b", prompt(4), max_tokens=2, adapter=2)
    bench.add("c", prompt(4), max_tokens=2, adapter=3)
    bench.add("d", prompt(4), max_tokens=2, adapter=1)
    bench.add("e", prompt(4), max_tokens=2)

    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans == [{"a#0": 4, "b#0": 4}, {"a#0": 1, "b#0": 1}, {"c#0": 4, "d#0": 4, "e#0": 4},
                     {"c#0": 1, "d#0": 1, "e#0": 1}]


# -- the token budget --------------------------------------------------------------------------


def test_a_long_prompt_is_prefilled_in_budget_sized_chunks_then_decodes() -> None:
    bench = Bench(max_num_batched_tokens=4)
    bench.add("a", prompt(10), max_tokens=2)

    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans == [{"a#0": 4}, {"a#0": 4}, {"a#0": 2}, {"a#0": 1}]
    assert bench.seq("a#0").output_token_ids == [1000, 1001]


def test_admissions_share_the_budget_left_by_running_sequences_in_queue_order() -> None:
    bench = Bench(max_num_batched_tokens=8)
    bench.add("a", prompt(10), max_tokens=3)
    bench.add("b", prompt(6, 100), max_tokens=3)
    bench.add("c", prompt(5, 200), max_tokens=3)

    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans == [
        {"a#0": 8},
        {"a#0": 2, "b#0": 6},
        {"a#0": 1, "b#0": 1, "c#0": 5},
        {"a#0": 1, "b#0": 1, "c#0": 1},
        {"c#0": 1},
    ]


def test_the_budget_is_never_exceeded_under_a_mixed_load() -> None:
    bench = Bench(num_blocks=40, max_num_batched_tokens=7, max_num_seqs=4)
    for i, length in enumerate([13, 1, 6, 9, 2, 7]):
        bench.add(f"r{i}", prompt(length, 100 * i), max_tokens=4, n=1 + i % 3)

    plans = bench.run_until_idle()

    assert max(out.num_batched_tokens for out in plans) == 7
    assert all(request.finished for request in bench.requests.values())
    assert bench.kv.num_free_blocks == 40


def test_max_num_seqs_holds_back_the_next_prompt_until_a_seat_frees() -> None:
    bench = Bench(max_num_seqs=2)
    bench.add("a", prompt(3), max_tokens=1)
    bench.add("b", prompt(3, 100), max_tokens=2)
    bench.add("c", prompt(3, 200), max_tokens=1)

    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans == [{"a#0": 3, "b#0": 3}, {"b#0": 1, "c#0": 3}]


def test_a_request_about_to_fork_reserves_a_seat_for_each_of_its_siblings() -> None:
    bench = Bench(max_num_seqs=3)
    bench.add("a", prompt(5), max_tokens=2, n=2)
    bench.add("b", prompt(3, 100), max_tokens=2)
    bench.add("c", prompt(3, 200), max_tokens=2)

    first = bench.step()

    assert plan(first) == {"a#0": 4, "b#0": 3}
    assert ids(bench.scheduler.running) == ["a#0", "a#1", "b#0"]
    assert ids(bench.scheduler.waiting) == ["c#0"]


def test_max_num_seqs_is_never_exceeded_when_forks_join_running_prefills() -> None:
    bench = Bench(num_blocks=40, max_num_batched_tokens=6, max_num_seqs=3)
    bench.add("a", prompt(9), max_tokens=2, n=2)
    bench.add("b", prompt(2, 100), max_tokens=2)
    bench.add("c", prompt(2, 200), max_tokens=2)

    most_running = 0
    while bench.scheduler.has_work:
        out = bench.step()
        assert len(out.scheduled) <= 3
        most_running = max(most_running, len(bench.scheduler.running))

    assert most_running == 3


# -- decodes first, prefills chunked -----------------------------------------------------------


def test_running_decodes_are_scheduled_before_an_older_unfinished_prefill() -> None:
    bench = Bench(max_num_batched_tokens=5)
    bench.add("a", prompt(2), max_tokens=4)
    bench.add("b", prompt(12, 100), max_tokens=1)
    bench.step()  # a: 2 (samples), b: 3
    # Put the prefill ahead of the decode in the running order, as a later scheduler change
    # (e.g. priority-ordered running) might; decodes must still go first.
    bench.scheduler.running.reverse()
    assert ids(bench.scheduler.running) == ["b#0", "a#0"]

    out = bench.step()

    assert [(item.seq.seq_id, item.num_new_tokens) for item in out.scheduled] == [("a#0", 1), ("b#0", 4)]


def test_a_waiting_prompt_is_chunked_into_the_budget_left_by_decodes() -> None:
    bench = Bench(max_num_batched_tokens=4)
    bench.add("a", prompt(3), max_tokens=3)
    bench.step()
    bench.add("b", prompt(7, 100), max_tokens=1)

    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans == [{"a#0": 1, "b#0": 3}, {"a#0": 1, "b#0": 3}, {"b#0": 1}]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_where_it_fits_whole() -> None:
    bench = Bench(max_num_batched_tokens=8, enable_chunked_prefill=False)
    bench.add("a", prompt(3), max_tokens=3)
    bench.step()
    bench.add("b", prompt(8, 100), max_tokens=1)
    bench.add("c", prompt(2, 200), max_tokens=1)

    plans = [plan(out) for out in bench.run_until_idle()]

    # c would fit beside a's decodes, but admission is first come, first served.
    assert plans == [{"a#0": 1}, {"a#0": 1}, {"b#0": 8}, {"c#0": 2}]


def test_a_prompt_that_waits_for_budget_keeps_no_computed_tokens() -> None:
    bench = Bench(max_num_batched_tokens=10, enable_chunked_prefill=False, enable_prefix_caching=True)
    bench.add("a", prompt(9), max_tokens=1)  # leaves blocks 0 and 1 cached
    bench.step()
    bench.add("b", prompt(3, 100), max_tokens=2)
    bench.step()
    bench.add("c", prompt(18), max_tokens=1)  # 8 cached tokens; 10 more do not fit beside b

    out = bench.step()

    assert plan(out) == {"b#0": 1}
    assert ids(bench.scheduler.waiting) == ["c#0"]
    assert bench.seq("c#0").num_computed_tokens == 0
    assert plan(bench.step()) == {"c#0": 10}


# -- priority ----------------------------------------------------------------------------------


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    bench = Bench(max_num_seqs=1)
    bench.add("late", prompt(2), max_tokens=1, priority=5)
    bench.add("urgent", prompt(2, 100), max_tokens=1, priority=0)
    bench.add("normal", prompt(2, 200), max_tokens=1, priority=1)
    bench.add("urgent2", prompt(2, 300), max_tokens=1, priority=0)

    assert ids(bench.scheduler.waiting) == ["urgent#0", "urgent2#0", "normal#0", "late#0"]
    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans == [{"urgent#0": 2}, {"urgent2#0": 2}, {"normal#0": 2}, {"late#0": 2}]


# -- preemption --------------------------------------------------------------------------------


def test_preemption_evicts_the_newest_running_sequence_and_requeues_it_first_with_its_output() -> None:
    bench = Bench(num_blocks=4, max_num_batched_tokens=16)
    bench.add("a", prompt(4), max_tokens=8)
    bench.add("b", prompt(4, 100), max_tokens=8)
    assert plan(bench.step()) == {"a#0": 4, "b#0": 4}  # blocks 0 and 1
    for _ in range(4):  # decode at positions 4..7: blocks 2 and 3
        assert plan(bench.step()) == {"a#0": 1, "b#0": 1}
    b = bench.seq("b#0")
    assert b.output_token_ids == [1001, 1003, 1005, 1007, 1009]
    bench.add("c", prompt(2, 200), max_tokens=1)

    out = bench.step()  # a needs a fifth block at position 8

    assert ids(out.preempted) == ["b#0"]
    assert plan(out) == {"a#0": 1}
    assert ids(bench.scheduler.waiting) == ["b#0", "c#0"]
    assert b.status is SequenceStatus.WAITING
    assert b.num_computed_tokens == 0
    assert b.output_token_ids == [1001, 1003, 1005, 1007, 1009]
    assert bench.kv.block_table("a#0").block_ids == [0, 2, 3]
    assert bench.scheduler.num_preemptions == 1


def test_a_preempted_sequence_recomputes_prompt_and_output_before_decoding_on() -> None:
    bench = Bench(num_blocks=4, max_num_batched_tokens=16)
    bench.add("a", prompt(4), max_tokens=6)
    bench.add("b", prompt(4, 100), max_tokens=7)
    for _ in range(6):
        bench.step()  # the sixth step preempts b and gives a its last token
    assert bench.requests["a"].finished

    plans = [plan(out) for out in bench.run_until_idle()]

    assert plans[0] == {"b#0": 9}  # 4 prompt + 5 output tokens, all recomputed at once
    assert plans[1:] == [{"b#0": 1}]
    assert bench.seq("b#0").num_output_tokens == 7
    assert bench.kv.num_free_blocks == 4


def test_preemption_takes_the_newest_others_first_and_then_the_sequence_asking() -> None:
    bench = Bench(num_blocks=3, max_num_batched_tokens=16)
    bench.add("a", prompt(4), max_tokens=8)
    bench.add("b", prompt(4, 100), max_tokens=8)
    bench.add("c", prompt(1, 200), max_tokens=8)
    assert plan(bench.step()) == {"a#0": 4, "b#0": 4, "c#0": 1}
    # Position 4 of a and of b each needs a new block; none is free.

    out = bench.step()

    # a takes c's block; b then finds only itself left to preempt (a is in the batch).
    assert ids(out.preempted) == ["c#0", "b#0"]
    assert plan(out) == {"a#0": 1}
    assert bench.kv.block_table("a#0").block_ids == [0, 2]
    assert ids(bench.scheduler.waiting) == ["b#0", "c#0"]
    assert ids(bench.scheduler.running) == ["a#0"]


def test_preemption_takes_the_lowest_priority_first_and_requeues_it_behind_higher_priorities() -> None:
    bench = Bench(num_blocks=3, max_num_batched_tokens=16)
    bench.add("low", prompt(4), max_tokens=8, priority=2)
    bench.add("high", prompt(4, 100), max_tokens=8, priority=0)
    bench.add("mid", prompt(1, 200), max_tokens=8, priority=1)
    assert plan(bench.step()) == {"low#0": 4, "high#0": 4, "mid#0": 1}
    bench.add("waiting-high", prompt(2, 300), max_tokens=1, priority=0)
    bench.add("waiting-low", prompt(2, 400), max_tokens=1, priority=3)
    # Position 4 of low and of high each needs a new block; none is free.

    out = bench.step()

    # low asks first and is the lowest priority: it goes itself (by recency mid would have); high takes its block.
    assert ids(out.preempted) == ["low#0"]
    assert plan(out) == {"high#0": 1, "mid#0": 1}
    assert ids(bench.scheduler.waiting) == ["waiting-high#0", "low#0", "waiting-low#0"]


def test_a_newer_sequence_already_in_the_batch_is_never_preempted() -> None:
    bench = Bench(num_blocks=2, max_num_batched_tokens=5)
    bench.add("a", prompt(2), max_tokens=4)
    bench.add("b", prompt(12, 100), max_tokens=1)
    assert plan(bench.step()) == {"a#0": 2, "b#0": 3}  # a: block 0, b: block 1
    bench.scheduler.running.reverse()  # the decode a is now the newest, and goes first

    out = bench.step()  # b's next chunk needs a new block

    assert ids(out.preempted) == ["b#0"]
    assert plan(out) == {"a#0": 1}
    assert ids(bench.scheduler.running) == ["a#0"]


def test_no_request_is_admitted_in_a_step_that_preempted() -> None:
    bench = Bench(num_blocks=3, max_num_batched_tokens=16)
    bench.add("a", prompt(4), max_tokens=8)
    bench.add("b", prompt(4, 100), max_tokens=8)
    bench.step()
    bench.step()  # a takes block 2 for position 4; b finds no block and preempts itself
    bench.add("c", prompt(1, 200), max_tokens=1)  # would fit in b's freed block

    out = bench.step()

    assert plan(out) == {"a#0": 1}
    assert ids(bench.scheduler.waiting) == ["b#0", "c#0"]


def test_a_fork_that_outgrows_the_pool_preempts_its_youngest_sibling() -> None:
    bench = Bench(num_blocks=3, max_num_batched_tokens=16)
    bench.add("a", prompt(7), max_tokens=2, n=3)

    first = bench.step()
    second = bench.step()

    assert plan(first) == {"a#0": 6}
    assert plan(second) == {"a#0": 1, "a#1": 1}
    assert second.block_copies == [BlockCopy(source=1, destination=2)]
    assert ids(second.preempted) == ["a#2"]
    assert ids(bench.scheduler.waiting) == ["a#2"]
    bench.run_until_idle()
    assert [s.num_output_tokens for s in bench.requests["a"].sequences] == [2, 2, 2]
    assert bench.kv.num_free_blocks == 3


# -- prefix caching and preemption -------------------------------------------------------------


def test_a_shared_prefix_is_computed_once() -> None:
    bench = Bench(enable_prefix_caching=True)
    bench.add("a", prompt(10), max_tokens=1)
    bench.step()
    bench.add("b", prompt(10), max_tokens=1)

    out = bench.step()

    assert plan(out) == {"b#0": 2}  # blocks 0 and 1 hit
    assert bench.kv.prefix_stats.hits == 8
    assert bench.requests["b"].num_cached_tokens == 8


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    bench = Bench(enable_prefix_caching=True)
    bench.add("a", prompt(8), max_tokens=1)
    bench.step()
    bench.add("b", prompt(8), max_tokens=1)

    out = bench.step()

    assert plan(out) == {"b#0": 4}  # the hit stops one token short: block 1 is recomputed
    assert bench.requests["b"].num_cached_tokens == 4


def test_a_preempted_sequence_resumes_from_its_own_cached_head() -> None:
    bench = Bench(num_blocks=5, max_num_batched_tokens=16, enable_prefix_caching=True)
    bench.add("a", prompt(8), max_tokens=8)
    bench.add("b", prompt(6, 100), max_tokens=8)
    assert plan(bench.step()) == {"a#0": 8, "b#0": 6}  # a: 0, 1; b: 2, 3
    assert plan(bench.step()) == {"a#0": 1, "b#0": 1}  # a takes block 4
    assert plan(bench.step()) == {"a#0": 1, "b#0": 1}  # b's block 3 is now full

    out = bench.step()  # b needs a new block at position 8: none left

    assert ids(out.preempted) == ["b#0"]
    assert plan(out) == {"a#0": 1}
    # b's blocks went back tail first (3, then 2), both cached: its head outlives its tail.
    assert bench.kv.pool.free_queue.block_ids() == [3, 2]

    bench.step()
    bench.step()  # a reaches position 12 and takes block 3, evicting b's tail
    assert bench.kv.block_table("a#0").block_ids == [0, 1, 4, 3]
    b = bench.seq("b#0")
    assert [blk.block_id for blk in bench.kv.find_cached_prefix(b.token_ids, 8).blocks] == [2]

    plans = [plan(out) for out in bench.run_until_idle()]

    # b cannot come back while a runs; then it recomputes from its cached first block:
    # 6 prompt + 3 output tokens = 9, minus 4 cached = 5.
    assert plans[:3] == [{"a#0": 1}, {"a#0": 1}, {"b#0": 5}]
    assert bench.requests["b"].num_cached_tokens == 0  # counted at first admission only
    assert bench.kv.num_free_blocks == 5


def test_preempting_a_sequence_that_shares_cached_blocks_frees_only_its_own() -> None:
    bench = Bench(num_blocks=4, max_num_batched_tokens=16, enable_prefix_caching=True)
    bench.add("a", prompt(8), max_tokens=8)
    assert plan(bench.step()) == {"a#0": 8}  # blocks 0 and 1, both cached
    bench.add("b", prompt(8), max_tokens=8)
    # a's decode takes block 2 first; b hits block 0 only (the hit stops one token short)
    # and recomputes tokens 4..7 into block 3.
    assert plan(bench.step()) == {"a#0": 1, "b#0": 4}
    assert bench.kv.block_table("a#0").block_ids == [0, 1, 2]
    assert bench.kv.block_table("b#0").block_ids == [0, 3]
    pool = bench.kv.pool
    assert [block.ref_count for block in pool.blocks] == [2, 1, 1, 1]

    out = bench.step()  # b needs a third block at position 8

    assert ids(out.preempted) == ["b#0"]
    assert plan(out) == {"a#0": 1}
    assert [block.ref_count for block in pool.blocks] == [1, 1, 1, 0]
    assert pool.free_queue.block_ids() == [3]
    b = bench.seq("b#0")
    assert [blk.block_id for blk in bench.kv.find_cached_prefix(b.token_ids, 8).blocks] == [0, 1]
    bench.run_until_idle()
    assert [s.num_output_tokens for s in (bench.seq("a#0"), b)] == [8, 8]
    assert bench.kv.num_free_blocks == 4
