"""Node 0 of the two-namespace test (tests/parallel/test_two_namespaces.py), run inside its namespace: rank 0 of a
tensor- or pipeline-parallel group whose other rank is on the other node; prints the greedy tokens of PROMPTS and
whether the group found a shared memory segment, as one JSON line."""

from __future__ import annotations

import argparse
import json

import torch

from ember.llm import LLM
from tests.parallel.tp_parity import greedy_tokens

PROMPTS = [[5, 9, 14, 200, 3, 77], list(range(30, 45))]
OPTIONS = {"block_size": 4, "num_kv_blocks": 100, "enable_prefix_caching": False}


def main() -> None:
    """Run rank 0 against the given master address and port; print {"tokens": ..., "shared_exchange": ...}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--mode", choices=("tensor", "pipeline"), required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    split = {"tensor_parallel_size": 2} if args.mode == "tensor" else {"pipeline_parallel_size": 2}
    llm = LLM(args.model, nnodes=2, node_rank=0, master_addr=args.master_addr, master_port=args.master_port,
              collective_timeout_s=60.0, **split, **OPTIONS)
    try:
        tokens = greedy_tokens(llm, PROMPTS)
        shared = llm.engine.workers.communicator.exchange is not None
    finally:
        llm.shutdown()
    print(json.dumps({"tokens": tokens, "shared_exchange": shared}), flush=True)


if __name__ == "__main__":
    main()
