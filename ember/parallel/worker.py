"""A worker rank: joins the group, loads its shard, then follows rank 0's commands until told to stop.

Started by rank 0 (ember.parallel.driver) as `python -m ember.parallel.worker ...`, or by hand
on another machine with the same flags (multi-node). The worker reads its standard input as a
lifeline: when rank 0 goes away (exit, crash, kill), the pipe closes and the worker exits at
once, so no worker outlives its engine.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import torch

from ember.kv.tensors import KVCacheTensors
from ember.layers.cpu_gemm import PackedWeight
from ember.layers.embedding import VocabEmbedding
from ember.layers.linear import Linear
from ember.models.loader import load_model
from ember.parallel.communicator import Communicator
from ember.parallel.config import ParallelConfig
from ember.parallel.group import connect
from ember.parallel.messages import AllocateKVCache, ComputeLogits, RunForward, StopWorker
from ember.parallel.modes import shard_factory
from ember.quant.choices import QUANT_ACTIVATIONS
from ember.quant.ggml.layers import set_activations

logger = logging.getLogger(__name__)

# A worker waits this long for rank 0's next command: idle servers send none for hours.
IDLE_WAIT_S = 7 * 24 * 3600.0
EXIT_ORPHANED = 3


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights this rank holds, each tensor once.

    Packed layers count their panels (a packed layer's state dict rebuilds a fresh dense copy,
    which would count a tied table twice: once for the head, once for the embedding reading its
    panels); quantized layers count their blocks (buffers the state dict leaves out; a tied table's
    once); everything else counts what its state dict holds.
    """
    panels: dict[str, PackedWeight] = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.packed is not None:
            panels[name] = module.packed
        elif isinstance(module, VocabEmbedding) and module.packed_table is not None:
            panels[name] = module.packed_table
    tensors: dict[int, int] = {}
    for key, tensor in model.state_dict().items():
        owner = panels.get(key.rpartition(".")[0])
        if owner is None:
            tensors[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
        else:
            bias_bytes = 0 if owner.bias is None else owner.bias.numel() * owner.bias.element_size()
            tensors[owner.panels.data_ptr()] = owner.panels.numel() * owner.panels.element_size() + bias_bytes
    for buffer in model.buffers():
        tensors.setdefault(buffer.data_ptr(), buffer.numel() * buffer.element_size())
    return sum(tensors.values())


class WorkerLoop:
    """Rank r's model shard and KV cache shard, driven by the commands rank 0 broadcasts.

    `scores_logits`: whether this rank holds a slice of the head (a later pipeline stage's ranks do not)."""

    def __init__(self, model: torch.nn.Module, communicator: Communicator, held_layers: range | None = None,
                 scores_logits: bool = True) -> None:
        self.model = model
        self.communicator = communicator
        self.held_layers = held_layers
        self.scores_logits = scores_logits
        self.caches: KVCacheTensors | None = None

    @torch.inference_mode()
    def run(self) -> None:
        while True:
            command = self.communicator.broadcast_object(timeout_s=IDLE_WAIT_S)
            if isinstance(command, StopWorker):
                return
            if isinstance(command, AllocateKVCache):
                self.caches = KVCacheTensors(
                    self.model, command.num_blocks, command.block_size, self.held_layers, command.dtype
                )
                self.communicator.gather_to_driver(torch.tensor([self.caches.num_bytes]))
            elif isinstance(command, RunForward):
                assert self.caches is not None, "rank 0 runs a step before allocating the KV cache"
                self.caches.copy_blocks(command.block_copies)
                self.model(command.input_ids, command.positions, self.caches.layer_caches, command.metadata)
            elif isinstance(command, ComputeLogits) and self.scores_logits:
                self.model.compute_logits(command.hidden)


def _exit_when_orphaned() -> None:
    """Block on stdin (rank 0 holds its other end); end of file means rank 0 is gone.

    A raw read, not sys.stdin: a daemon thread holding the buffered reader's lock would abort
    the interpreter's shutdown after a clean stop.
    """
    while os.read(sys.stdin.fileno(), 1):
        pass
    os._exit(EXIT_ORPHANED)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ember.parallel.worker", description=__doc__)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--enable-expert-parallel", action="store_true")
    parser.add_argument("--enable-sequence-parallel", action="store_true")
    parser.add_argument("--exact-row-parallel", action="store_true")
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--collective-timeout", type=float, required=True)
    parser.add_argument("--startup-timeout", type=float, required=True)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of this rank")
    parser.add_argument("--quant-activations", default="int8", choices=QUANT_ACTIVATIONS,
                        help="what quantized layers round their inputs to (the engine's --quant-activations)")
    parser.add_argument("--max-model-len", type=int, default=None, help="the context the engine serves")
    parser.add_argument("--no-lifeline", action="store_true", help="do not exit when stdin closes (a rank started by hand)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"[rank {args.rank}] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; rank 0 stops us
    if not args.no_lifeline:
        threading.Thread(target=_exit_when_orphaned, name="ember-lifeline", daemon=True).start()
    if args.threads:
        torch.set_num_threads(args.threads)
    parallel = ParallelConfig.split_from_args(args)
    communicator = connect(
        args.rank, parallel.world_size, args.master_addr, args.master_port, args.collective_timeout, args.startup_timeout
    )
    loaded = load_model(args.model, args.dtype, shard_for=shard_factory(communicator, parallel), max_model_len=args.max_model_len)
    set_activations(loaded.model, args.quant_activations)
    communicator.gather_to_driver(torch.tensor([parameter_bytes(loaded.model)]), args.startup_timeout)
    assert loaded.shard is not None
    WorkerLoop(loaded.model, communicator, loaded.shard.held_layers, parallel.scores_logits(args.rank)).run()


if __name__ == "__main__":
    main()
