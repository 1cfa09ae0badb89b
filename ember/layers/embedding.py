"""The token embedding of the decoder: one copy of a tied table, activations in the compute dtype.

With tied embeddings the LM head and the embedding are one matrix. Once the head is packed for
the CPU kernel (ember.layers.linear), `read_from_packed_head` drops the embedding's dense copy and
looks rows up in the head's panels instead. `output_dtype` is the dtype the decoder computes in:
bfloat16 weights on the CPU run with float32 activations (the products read bfloat16 and sum in
float32 anyway, and torch's elementwise bfloat16 ops are slow without native bfloat16 math).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.cpu_gemm import PackedWeight
from ember.layers.linear import Linear


class VocabEmbedding(nn.Embedding):
    """`nn.Embedding` that can read a packed tied head's rows and cast its output."""

    packed_table: PackedWeight | None = None  # the tied head's panels, once shared
    output_dtype: torch.dtype | None = None  # None: the table's own dtype

    def reset_parameters(self) -> None:
        """Random rows, except for a table built on the meta device to be loaded: there is nothing to draw, and
        torch's first `normal_` on meta tensors costs seconds of one-time setup per process."""
        if not self.weight.is_meta:
            super().reset_parameters()

    def read_from_packed_head(self, head: Linear) -> None:
        """Look rows up in `head`'s panels (the same matrix, tied) and free the dense copy."""
        if head.packed is None or tuple(head.packed.dense_shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError("a tied embedding reads only from a packed head of its own shape")
        self.packed_table = head.packed
        del self.weight
        self.register_parameter("weight", None)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        if self.packed_table is None:
            super()._save_to_state_dict(destination, prefix, keep_vars)
        else:
            destination[prefix + "weight"] = self.packed_table.dense()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.packed_table is not None:
            rows = self.packed_table.rows(input_ids)
        else:
            rows = F.embedding(input_ids, self.weight)
        return rows if self.output_dtype is None else rows.to(self.output_dtype)
