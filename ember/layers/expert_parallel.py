"""Expert parallelism: each rank holds a contiguous range of the routed experts; one all-reduce joins them.

Everything else of the MoE block (router, shared experts) is whole on every rank, so every rank
routes every token the same way. A rank runs its own experts over the tokens routed to them and
scatters the weighted outputs into a zero [tokens, hidden] tensor; the all-reduce sums the ranks'
tensors. The pairs are sorted by expert and the ranks' ranges are in expert order, so a token's
contributions are added in the order one process adds them: with top-2 routing the sum is the
same float32 number (a token's pair on rank 0 plus its pair on rank 1, or both on one rank).
"""

from __future__ import annotations

import torch
from torch import nn

from ember.config.model import MoEConfig
from ember.layers.collectives import Collectives
from ember.layers.moe import ExpertDispatch, SparseMoE


class ExpertParallelMoE(SparseMoE):
    """`SparseMoE` holding experts [first_expert, stop_expert); the others are empty placeholders
    (so checkpoint names keep their global expert index)."""

    def __init__(
        self,
        hidden_size: int,
        config: MoEConfig,
        expert_factory: type[nn.Module],
        shared_name: str,
        rank_experts: list[range],
        communicator: Collectives,
    ) -> None:
        """`rank_experts[r]`: the experts rank r holds (contiguous, in rank order); this rank's are kept."""
        super().__init__(hidden_size, config, expert_factory, shared_name)
        held_experts = rank_experts[communicator.rank]
        for index in range(config.num_experts):
            if index not in held_experts:
                self.experts[index] = nn.Module()  # held by another rank: no weights here
        self.held_experts = held_experts
        self.communicator = communicator
        self.rank_experts = rank_experts
        # Routed (token, expert) pairs each rank has run since load (routing is replicated: every rank knows all).
        self.pairs_per_rank = [0] * len(rank_experts)

    def run_experts(self, x: torch.Tensor, dispatch: ExpertDispatch) -> torch.Tensor:
        """This rank's experts over their slice of the sorted pairs, summed over the ranks."""
        counts = dispatch.tokens_per_expert
        for rank, experts in enumerate(self.rank_experts):
            self.pairs_per_rank[rank] += sum(counts[experts.start : experts.stop])
        first = sum(counts[: self.held_experts.start])
        stop = first + sum(counts[self.held_experts.start : self.held_experts.stop])
        local_tokens = dispatch.token_indices[first:stop]
        sorted_x = x[local_tokens]
        expert_out = torch.empty_like(sorted_x)
        start = 0
        for index in self.held_experts:
            count = counts[index]
            if count:
                expert_out[start : start + count] = self.experts[index](sorted_x[start : start + count])
                start += count
        expert_out *= dispatch.weights[first:stop].unsqueeze(1).to(expert_out.dtype)
        partial = torch.zeros_like(x).index_add_(0, local_tokens, expert_out)
        return self.communicator.all_reduce(partial)
