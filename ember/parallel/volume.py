"""How many bytes a rank sends per token under each parallel mode: the formulas the counted collectives must equal.

W ranks, L layers, hidden size H, activation element size e (bytes), per token and rank:

- tensor parallel: a [tokens, H] all-reduce after each attention output and MLP down projection,
  and one after the vocabulary-parallel embedding. A ring all-reduce sends 2 (W - 1) / W of the
  tensor:  (2 L + 1) * H * e * 2 (W - 1) / W. Scoring a sampled row also gathers each worker's
  vocabulary slice on rank 0: ceil(V / W) * e bytes per sampled token from every worker.
- tensor parallel with sequence parallelism: each all-reduce becomes a reduce-scatter (into
  blocks of tokens) and an all-gather (before the next column-parallel product, and of the final
  norm's output for the head), each (W - 1) / W of the tensor: the same bytes, counted per token
  of the batch padded to a multiple of W.
- tensor parallel with exact row layers: the embedding's all-reduce, then per layer four
  all-gathers (the attention output's columns, the o_proj output slices, the MLP's inner
  columns, the down output slices), each (W - 1) times the widest rank's slice:
  H e 2 (W - 1) / W + L (W - 1) (Q_r + I_r + 2 H_r) e, with Q_r, I_r, H_r the widest query,
  inner and hidden slices.
- pipeline parallel: each stage sends its [tokens, H] output once to the next stage (the last
  one back to rank 0, which holds the head), as float32:  H * 4.
- tensor x pipeline (T ranks per stage), as rank 0 counts it: its stage's all-reduces over its T
  ranks (L_0 layers of stage 0, plus the embedding's) and one float32 row sent to the next stage:
  (2 L_0 + 1) * H * e * 2 (T - 1) / T + H * 4; the head's gather is over the first stage's T ranks.
- expert parallel: one [tokens, H] all-reduce of the experts' partial outputs per MoE layer
  (L_moe = L minus the dense layers):  L_moe * H * e * 2 (W - 1) / W.

The step's plan (token ids, positions, slot mapping, block tables) is broadcast once per step:
control traffic, counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.config.model import ModelConfig
from ember.layers.pipeline import WIRE_DTYPE
from ember.parallel.config import ParallelConfig
from ember.parallel.sharding import TensorParallelShard
from ember.parallel.stage_split import stage_spans


@dataclass(frozen=True)
class ParallelVolume:
    """Predicted traffic of one rank: `kinds` are the communicator counters whose sum the formula predicts."""

    kinds: tuple[str, ...]  # e.g. ("all_reduce",), ("reduce_scatter", "all_gather"), ("send",)
    calls_per_forward: int  # over all `kinds`
    bytes_per_token: float
    formula: str
    logits_gather_bytes_per_sampled_token: int = 0  # tensor parallel: sent by each worker rank to rank 0
    per_padded_token: bool = False  # sequence parallel: per token of each forward pass padded to a multiple of W

    def counted_tokens(self, pass_tokens: list[int], world_size: int) -> int:
        """The tokens `bytes_per_token` is per, for forward passes of `pass_tokens` tokens each."""
        if self.per_padded_token:
            return sum(-(-tokens // world_size) * world_size for tokens in pass_tokens)
        return sum(pass_tokens)


def parallel_volume(config: ModelConfig, parallel: ParallelConfig, element_bytes: int) -> ParallelVolume:
    """The formula of `parallel.mode` (see the module docstring) for `config`."""
    world_size, hidden = parallel.world_size, config.hidden_size
    ring_share = 2 * (world_size - 1) / world_size
    if parallel.mode == "tensor":
        calls = 2 * config.num_layers + 1
        gather = -(-config.vocab_size // world_size) * element_bytes
        if parallel.exact_row_parallel:
            return _exact_row_parallel_volume(config, world_size, element_bytes, gather)
        if parallel.enable_sequence_parallel:
            return ParallelVolume(
                ("reduce_scatter", "all_gather"), 2 * calls, calls * hidden * element_bytes * ring_share,
                "(2L+1) H e 2(W-1)/W (reduce-scatter + all-gather, padded tokens)", gather, per_padded_token=True,
            )  # fmt: skip
        return ParallelVolume(("all_reduce",), calls, calls * hidden * element_bytes * ring_share, "(2L+1) H e 2(W-1)/W", gather)
    if parallel.mode == "tensor-pipeline" and not parallel.exact_row_parallel:
        tensor_size, first_stage = parallel.tensor_parallel_size, stage_spans(config, parallel.pipeline_parallel_size)[0]
        calls = 2 * (first_stage.stop - first_stage.start) + 1
        ring = 2 * (tensor_size - 1) / tensor_size
        return ParallelVolume(
            ("all_reduce", "send"), calls + 1, calls * hidden * element_bytes * ring + hidden * WIRE_DTYPE.itemsize,
            "(2 L_0 + 1) H e 2(T-1)/T + H 4 (rank 0: its stage's all-reduces, one float32 row to the next stage)",
            -(-config.vocab_size // tensor_size) * element_bytes,
        )  # fmt: skip
    if parallel.mode == "pipeline":
        wire_bytes = WIRE_DTYPE.itemsize
        return ParallelVolume(("send",), 1, hidden * wire_bytes, f"H {wire_bytes} (one float32 activation row per stage)")
    if parallel.mode == "expert":
        if config.moe is None:
            raise ValueError("expert parallelism needs an MoE model: drop --enable-expert-parallel for this one")
        calls = config.num_layers - len(config.moe.dense_layers)
        return ParallelVolume(("all_reduce",), calls, calls * hidden * element_bytes * ring_share, "L_moe H e 2(W-1)/W")
    if parallel.mode == "tensor-pipeline":
        raise ValueError("no traffic formula for tensor x pipeline with --exact-row-parallel yet: measure it without the flag")
    raise ValueError("a single process sends nothing: no volume to predict")


def _exact_row_parallel_volume(config: ModelConfig, world_size: int, element_bytes: int, gather: int) -> ParallelVolume:
    shard = TensorParallelShard(config, 0, world_size)
    widest_hidden = max(span.size for span in shard.hidden_spans)
    widest_slices = max(shard.row_input_sizes("query")) + max(shard.row_input_sizes("inner")) + 2 * widest_hidden
    embedding = config.hidden_size * element_bytes * 2 * (world_size - 1) / world_size
    return ParallelVolume(
        ("all_reduce", "all_gather"), 1 + 4 * config.num_layers,
        embedding + config.num_layers * (world_size - 1) * widest_slices * element_bytes,
        "H e 2(W-1)/W + L (W-1) (Q_r + I_r + 2 H_r) e (all-gathers)", gather,
    )  # fmt: skip
