"""Multi-head latent attention (DeepSeek-V2) over a paged cache of compressed latents.

Per token and layer the cache holds `c_kv` (the RMS-normed latent, `kv_lora_rank` wide) and the
rotated rope key shared by all heads (`qk_rope_head_dim`): `[num_blocks, block_size, r + d_rope]`.
Keys and values are `W_UK c_kv` and `W_UV c_kv` per head (`kv_b_proj`).

Prefill expands the latent to per-head keys and values and runs ordinary attention. Decode uses
the absorbed form: `q_nope W_UK` turns each head's query into latent space, so scores are one dot
product with the cached entries `[c_kv, k_rope]`, and the weighted latent goes through `W_UV`
after the softmax: the latent is never expanded per step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ember.config.model import LatentAttentionConfig, ModelConfig, YarnRope
from ember.layers import cpu_attention
from ember.layers.attention import AttentionMetadata, DecodeBatch, PrefillSegment
from ember.layers.linear import DenseLinear, Linear
from ember.layers.norm import RMSNorm
from ember.layers.rotary import rope_inverse_frequencies

LATENT_NORM_EPS = 1e-6  # transformers' DeepSeek-V2 builds its latent norms with the default eps


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched `scale` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inverse_frequencies(rope_dim: int, theta: float, yarn: YarnRope) -> torch.Tensor:
    """YaRN: short wavelengths kept (extrapolated), long ones divided by `factor`, a linear ramp between."""

    def correction_dim(num_rotations: float) -> float:
        wavelengths = yarn.original_max_position_embeddings / (num_rotations * 2 * math.pi)
        return rope_dim * math.log(wavelengths) / (2 * math.log(theta))

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rope_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolation = rope_inverse_frequencies(rope_dim, theta, None)
    return extrapolation / yarn.factor * ramp + extrapolation * (1 - ramp)


def yarn_attention_factor(yarn: YarnRope) -> float:
    """The factor YaRN multiplies cos and sin by."""
    if yarn.attention_factor is not None:
        return yarn.attention_factor
    if yarn.mscale and yarn.mscale_all_dim:
        return yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor, yarn.mscale_all_dim)
    return yarn_mscale(yarn.factor)


class InterleavedRotaryEmbedding:
    """RoPE on adjacent pairs (x[2i], x[2i+1]), the layout of DeepSeek-V2's checkpoints (YaRN optional)."""

    def __init__(
        self, rope_dim: int, max_positions: int, theta: float, yarn: YarnRope | None = None, device: str = "cpu"
    ) -> None:
        if yarn is None:
            inv_freq, factor = rope_inverse_frequencies(rope_dim, theta, None), 1.0
        else:
            inv_freq, factor = yarn_inverse_frequencies(rope_dim, theta, yarn), yarn_attention_factor(yarn)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64, device=device), inv_freq.to(device))
        self.cos = (angles.cos() * factor).float()
        self.sin = (angles.sin() * factor).float()

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, heads, rope_dim] rotated by each token's position."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        pairs = x.float().unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


class LatentAttention(nn.Module):
    """DeepSeek-V2 attention; parameter names follow transformers."""

    def __init__(self, config: ModelConfig, rotary: InterleavedRotaryEmbedding) -> None:
        super().__init__()
        if config.mla is None:
            raise ValueError("latent attention needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
        mla: LatentAttentionConfig = config.mla
        self.mla = mla
        self.num_heads = config.num_heads
        self.qk_head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        self.scale = self.qk_head_dim**-0.5
        if mla.yarn is not None and mla.yarn.mscale_all_dim:
            self.scale *= yarn_mscale(mla.yarn.factor, mla.yarn.mscale_all_dim) ** 2
        hidden, heads, bias = config.hidden_size, config.num_heads, config.qkv_bias
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(mla.q_lora_rank, heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        # kept dense: decode reads its weight itself (the absorbed form), so it is never packed nor held in blocks
        self.kv_b_proj = DenseLinear(mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.o_proj = Linear(heads * mla.v_head_dim, hidden, bias=config.output_bias)
        self.rotary = rotary

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens, mla = x.shape[0], self.mla
        q = self._query(x).view(num_tokens, self.num_heads, self.qk_head_dim)
        q_nope, q_rope = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        q_rope = self.rotary.rotate(positions, q_rope)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        k_rope = self.rotary.rotate(positions, k_rope.unsqueeze(1)).squeeze(1)
        entries = torch.cat((self.kv_a_layernorm(latent), k_rope), dim=-1)  # [T, r + d_rope]
        kv_cache.view(-1, entries.shape[1])[metadata.slot_mapping] = entries.to(kv_cache.dtype)  # index_put: float8 too
        out = x.new_empty(num_tokens, self.num_heads, mla.v_head_dim)
        for segment in metadata.prefills:
            rows = slice(segment.start, segment.end)
            out[rows] = self._prefill(q_nope[rows], q_rope[rows], entries[rows], kv_cache, segment)
        if metadata.decode is not None:
            batch = metadata.decode
            rows = batch.token_indices
            out[rows] = self._decode_absorbed(q_nope[rows], q_rope[rows], kv_cache, batch, metadata.paged)
        return self.o_proj(out.flatten(1))

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        if self.mla.q_lora_rank is None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def _prefill(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        new_entries: torch.Tensor,
        kv_cache: torch.Tensor,
        segment: PrefillSegment,
    ) -> torch.Tensor:
        """Expanded attention of one prompt chunk: keys and values built from the latents."""
        mla = self.mla
        if segment.num_cached == 0:
            entries = new_entries.to(kv_cache.dtype).to(new_entries.dtype)  # what the cache holds (a no-op when exact)
        else:
            entries = kv_cache[segment.block_table].flatten(0, 1)[: segment.seq_len].to(q_nope.dtype)
        latent, k_rope = entries.split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(latent).view(-1, self.num_heads, mla.qk_nope_head_dim + mla.v_head_dim)
        k_nope, value = kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=-1)
        key = torch.cat((k_nope, k_rope.unsqueeze(1).expand(-1, self.num_heads, -1)), dim=-1)
        query = torch.cat((q_nope, q_rope), dim=-1)
        query_positions = torch.arange(segment.num_cached, segment.seq_len).unsqueeze(1)
        mask = torch.arange(segment.seq_len).unsqueeze(0) <= query_positions
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), attn_mask=mask, scale=self.scale
        )
        return out.transpose(0, 1)

    def _decode_absorbed(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: DecodeBatch,
        paged: cpu_attention.PagedBatch | None = None,
    ) -> torch.Tensor:
        """One token per request; W_UK folded into the query, W_UV applied after the softmax.

        On the CPU the fused op reads the latent rows through the block tables (one kv head whose
        values are the first r entries of each row); the torch code below is its reference.
        """
        mla = self.mla
        w_kv = self.kv_b_proj.weight.view(self.num_heads, mla.qk_nope_head_dim + mla.v_head_dim, mla.kv_lora_rank)
        w_uk, w_uv = w_kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=1)
        q_latent = torch.einsum("bhn,hnr->bhr", q_nope, w_uk)  # [B, H, r]
        query = torch.cat((q_latent, q_rope), dim=-1)  # [B, H, r + d_rope]
        op = cpu_attention.load_attention() if paged is not None and kv_cache.device.type == "cpu" else None
        if op is not None:
            latent_out = op.latent(query, kv_cache, mla.kv_lora_rank, paged.decode_only(), self.scale).to(query.dtype)
            return torch.einsum("bhr,hvr->bhv", latent_out, w_uv)
        entries = kv_cache[batch.block_tables].flatten(1, 2).to(query.dtype)  # [B, L, r + d_rope]
        scores = torch.matmul(query, entries.transpose(1, 2)).float() * self.scale  # [B, H, L]
        scores.masked_fill_(~batch.key_mask[:, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(entries.dtype)
        latent_out = torch.matmul(weights, entries[..., : mla.kv_lora_rank])  # [B, H, r]
        return torch.einsum("bhr,hvr->bhv", latent_out, w_uv)
