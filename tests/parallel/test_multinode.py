"""Two "nodes" on loopback: node 1 is `ember serve --nnodes 2 --node-rank 1` (a separate process tree
running rank 1 only), node 0 is an engine with rank 0; together they generate what one process does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember.llm import LLM
from ember.parallel.group import free_port
from tests.model_factory import save_tiny_model
from tests.parallel.tp_parity import greedy_tokens

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 9, 14, 200, 3, 77], list(range(30, 45))]


@pytest.mark.slow
def test_two_nodes_on_loopback_generate_what_one_process_does(tmp_path: Path, single_thread_torch):
    folder = save_tiny_model("llama", tmp_path / "llama")
    port = free_port()
    node_one = subprocess.Popen(
        [
            sys.executable, "-m", "ember.cli.main", "serve", "--model", str(folder), "--tensor-parallel-size", "2",
            "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    try:
        options = dict(block_size=4, num_kv_blocks=100, enable_prefix_caching=False)
        node_zero = LLM(str(folder), tensor_parallel_size=2, nnodes=2, node_rank=0, master_port=port, **options)
        assert node_zero.engine.workers.processes == []  # rank 1 lives in the other process tree
        parallel_tokens = greedy_tokens(node_zero, PROMPTS)
        node_zero.shutdown()
        assert node_one.wait(60) == 0  # told to stop by rank 0, the other node exits cleanly
        assert parallel_tokens == greedy_tokens(LLM(str(folder), **options), PROMPTS)
    finally:
        if node_one.poll() is None:
            node_one.kill()
