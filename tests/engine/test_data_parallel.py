"""The pieces of data-parallel serving that are plain functions: how cores are shared out, how the flags read, how
several replicas' stats add up (the replicas themselves: tests/server/test_data_parallel_serve.py)."""

from __future__ import annotations

import os

import pytest

from ember.engine.data_parallel import combined_stats
from ember.engine.data_parallel_config import DataParallelConfig, parse_cpus, replica_cores
from ember.engine.llm_engine import EngineStats


def stats(running: int, used_share: float, total_blocks: int, histogram: tuple[int, ...] = ()) -> EngineStats:
    return EngineStats(
        num_running=running, num_waiting=1, kv_cache_usage=used_share, num_free_blocks=total_blocks // 2,
        num_total_blocks=total_blocks, block_size=16, kv_cache_bytes=1000, prefix_cache_queries=10, prefix_cache_hits=4,
        num_preemptions=0, num_steps=7, prompt_tokens_total=100, generation_tokens_total=50, computed_tokens_total=150,
        spec_draft_time_s=0.5, spec_accepted_histogram=histogram,
    )  # fmt: skip


def test_each_replica_gets_a_contiguous_even_share_of_the_cores():
    cores = [0, 1, 2, 3, 4, 5, 6]
    assert [sorted(replica_cores(index, 2, cores)) for index in range(2)] == [[0, 1, 2], [3, 4, 5, 6]]
    assert [sorted(replica_cores(index, 3, cores)) for index in range(3)] == [[0, 1], [2, 3], [4, 5, 6]]


def test_more_replicas_than_cores_share_the_cores_one_each_round_robin():
    assert [sorted(replica_cores(index, 3, [4, 5])) for index in range(3)] == [[4], [5], [4]]


def test_cpu_lists_read_like_taskset_lists():
    assert parse_cpus("0,2-3") == (0, 2, 3)
    assert parse_cpus("3,1") == (1, 3)
    assert parse_cpus("all") == tuple(sorted(os.sched_getaffinity(0)))
    with pytest.raises(ValueError, match="--data-parallel-cpus 'x-y'"):
        parse_cpus("x-y")


def test_the_config_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="--data-parallel-size"):
        DataParallelConfig(size=0)
    with pytest.raises(ValueError, match="--data-parallel-cpus"):
        DataParallelConfig(size=2, cpus=(max(os.sched_getaffinity(0)) + 1,))
    assert not DataParallelConfig(size=1).is_replicated
    assert DataParallelConfig(size=1, cpus=(min(os.sched_getaffinity(0)),)).is_replicated


def test_replicas_stats_add_up_as_one_engine():
    combined = combined_stats([stats(2, 0.5, 100, (3, 1)), stats(3, 0.2, 300, (1, 1, 5))])
    assert (combined.num_running, combined.num_waiting, combined.num_total_blocks) == (5, 2, 400)
    assert combined.kv_cache_usage == pytest.approx((0.5 * 100 + 0.2 * 300) / 400)
    assert combined.block_size == 16 and combined.generation_tokens_total == 100 and combined.spec_draft_time_s == 1.0
    assert combined.spec_accepted_histogram == (4, 2, 5)
