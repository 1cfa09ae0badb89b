"""Ranks on one machine share its cores: each gets its share of rank 0's torch threads, rank 0 included."""

from __future__ import annotations

import pytest
import torch

from ember.llm import LLM
from ember.parallel.config import ParallelConfig
from tests.model_factory import save_tiny_model


def test_the_callers_threads_are_shared_out_over_this_nodes_ranks():
    assert ParallelConfig(tensor_parallel_size=2).rank_threads(8) == 4
    assert ParallelConfig(tensor_parallel_size=4).rank_threads(2) == 1  # never below one
    assert ParallelConfig(pipeline_parallel_size=2, threads_per_rank=3).rank_threads(8) == 3
    other_node = ParallelConfig(tensor_parallel_size=4, nnodes=2, node_rank=1, master_port=29500)
    assert other_node.rank_threads(8) == 4  # two of the four ranks run here


def test_fewer_than_one_thread_per_rank_is_refused_with_the_flag():
    with pytest.raises(ValueError, match="--threads-per-rank"):
        ParallelConfig(tensor_parallel_size=2, threads_per_rank=0)


def test_rank_0_runs_on_its_share_while_the_group_lives_and_gets_its_threads_back(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "llama")
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        llm = LLM(str(folder), tensor_parallel_size=2, block_size=4, num_kv_blocks=64)
        try:
            workers = llm.engine.workers
            assert workers.threads_per_rank == 1 and torch.get_num_threads() == 1
            arguments = workers.processes[0].args
            assert arguments[arguments.index("--threads") + 1] == "1"
        finally:
            llm.shutdown()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
