"""Sparse mixture-of-experts feed-forward with token dispatch grouped by expert.

Each token picks its top-k experts from a softmax router. The (token, expert) pairs are sorted
by expert, so each expert runs one matmul chain over its contiguous slice of tokens; the
outputs are weighted and scattered back with one `index_add_`. The only Python loop is over
experts (a fixed, small count), never over tokens; an expert no token chose is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ember.config.model import MoEConfig
from ember.layers.linear import Linear


class GatedMLP(nn.Module):
    """SwiGLU feed-forward `down(silu(gate(x)) * up(x))`; gate and up fused, packed at load from
    the checkpoint's gate_proj / up_proj (transformers' Llama/Qwen/DeepSeek names)."""

    packed_modules = {"gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MixtralExpert(nn.Module):
    """Mixtral's expert: the same SwiGLU, packed from its checkpoint names w1 (gate) and w3 (up); w2 is down."""

    packed_modules = {"w13": ("w1", "w3")}

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w13 = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.w2 = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


@dataclass
class ExpertDispatch:
    """Where each routed (token, expert) pair went, sorted by expert."""

    token_indices: torch.Tensor  # [T * k] the token of each sorted pair
    weights: torch.Tensor  # [T * k] its routing weight
    tokens_per_expert: list[int]  # [E] how many pairs each expert got (0 for an idle expert)


def route_top_k(router_logits: torch.Tensor, config: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax router -> (weights [T, k], expert ids [T, k]), normalized and scaled as the config says.

    With expert groups (DeepSeek-V2's group-limited greedy), a token first picks the
    `num_selected_groups` groups whose best expert scores highest, then its top-k inside them.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    if config.num_expert_groups:
        num_tokens = probs.shape[0]
        grouped = probs.view(num_tokens, config.num_expert_groups, -1)
        best_groups = grouped.max(dim=-1).values.topk(config.num_selected_groups or 1, dim=-1).indices
        group_mask = torch.zeros_like(grouped[..., 0]).scatter_(1, best_groups, 1.0)
        probs = (grouped * group_mask.unsqueeze(-1)).view(num_tokens, -1)
    weights, experts = torch.topk(probs, config.num_experts_per_token, dim=-1)
    if config.normalize_top_k:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * config.routed_scaling_factor, experts


def group_by_expert(weights: torch.Tensor, experts: torch.Tensor, num_experts: int) -> ExpertDispatch:
    """Sort the (token, expert) pairs by expert so each expert's tokens are one contiguous slice."""
    flat_experts = experts.flatten()
    order = torch.argsort(flat_experts, stable=True)
    top_k = experts.shape[1]
    counts = torch.bincount(flat_experts, minlength=num_experts)
    return ExpertDispatch(order // top_k, weights.flatten()[order], counts.tolist())


class SparseMoE(nn.Module):
    """Routed experts plus optional shared experts; `gate` is the router (transformers' name).

    `shared_name` is where the shared experts live in the checkpoint ("shared_expert" in
    Qwen2-MoE, "shared_experts" in DeepSeek-V2).
    """

    def __init__(
        self,
        hidden_size: int,
        config: MoEConfig,
        expert_factory: type[nn.Module] = GatedMLP,
        shared_name: str = "shared_expert",
    ) -> None:
        super().__init__()
        self.config = config
        self.gate = nn.Linear(hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            expert_factory(hidden_size, config.expert_intermediate_size) for _ in range(config.num_experts)
        )
        self.shared_name = shared_name if config.shared_intermediate_size else None
        if self.shared_name is not None:
            self.add_module(shared_name, GatedMLP(hidden_size, config.shared_intermediate_size))
        if config.has_shared_expert_gate:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route_top_k(self.gate(x), self.config)
        out = self.run_experts(x, group_by_expert(weights, experts, self.config.num_experts))
        if self.shared_name is not None:
            shared = getattr(self, self.shared_name)(x)
            if self.config.has_shared_expert_gate:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out

    def run_experts(self, x: torch.Tensor, dispatch: ExpertDispatch) -> torch.Tensor:
        """One call per expert on its slice of the sorted tokens, weighted, summed back per token."""
        sorted_x = x[dispatch.token_indices]
        expert_out = torch.empty_like(sorted_x)
        start = 0
        for expert, count in zip(self.experts, dispatch.tokens_per_expert, strict=True):
            if count:
                expert_out[start : start + count] = expert(sorted_x[start : start + count])
                start += count
        expert_out *= dispatch.weights.unsqueeze(1).to(expert_out.dtype)
        return torch.zeros_like(x).index_add_(0, dispatch.token_indices, expert_out)
