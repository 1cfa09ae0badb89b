"""The model's architecture as plain data: `ModelConfig` and the config types its parts take (experts, latent
attention, rotary scaling).

Read from a checkpoint by ember.models (each family's reader, found through its registry); any floor may take these
(the KV cache sizes itself from a `ModelConfig`, a layer builds itself from a `MoEConfig`) without importing a model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MoEConfig:
    """A sparse mixture-of-experts feed-forward: top-k routed experts, optional shared experts.

    `dense_layers` use a plain MLP of `intermediate_size` instead. Qwen2-MoE gates its shared
    expert with a sigmoid (`has_shared_expert_gate`); DeepSeek-V2 adds its shared experts as is.
    """

    num_experts: int
    num_experts_per_token: int
    expert_intermediate_size: int
    normalize_top_k: bool = True
    routed_scaling_factor: float = 1.0
    shared_intermediate_size: int = 0
    has_shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    num_expert_groups: int | None = None  # group-limited routing: experts only from the best groups
    num_selected_groups: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_token}) must be from 1 to the number of experts ({self.num_experts})"
            )


@dataclass(frozen=True)
class YarnRope:
    """YaRN rope extension (DeepSeek-V2's `rope_scaling`): ramped frequencies, scaled attention."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class LatentAttentionConfig:
    """DeepSeek-V2 multi-head latent attention: low-rank KV (and optionally Q) with a decoupled rope key."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    yarn: YarnRope | None = None


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency rescaling: "linear" (factor), "llama3" (factor, low/high freq, original ctx),
    "frequency_factors" (each rotation pair's frequency divided by its own factor: a GGUF's `rope_freqs`
    tensor, which is how llama.cpp's converter stores Llama 3.1's scaling) or "longrope" (Phi-3's: a context within
    `original_max_position_embeddings` divides by `frequency_factors`, the short ones, a longer one by
    `long_frequency_factors`; cos and sin scaled by `attention_factor`)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    frequency_factors: tuple[float, ...] = ()
    long_frequency_factors: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one decoder-only transformer, of any family ember runs (its `architecture`: transformers' model_type)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rotary_dim: int | None = None  # the leading dims of each head that rotate (Phi-4-mini: 3/4 of them); None: all
    # Positions the rotary tables cover: the context the engine serves (`for_context`); None: max_position_embeddings.
    rotary_positions: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' own base; None: rope_theta
    local_rope_scaling: RopeScaling | None = None  # Gemma 3: the sliding layers' own scaling (None: unscaled)
    nope_layers: tuple[int, ...] = ()  # layers whose attention takes no rotary positions (SmolLM3: every fourth)
    # Granite's scalars: embeddings times embedding_multiplier, attention scores scaled by attention_multiplier (None:
    # head_dim ** -0.5), attention and MLP outputs times residual_multiplier before the residual add, logits divided
    # by logits_scaling.
    embedding_multiplier: float = 1.0
    attention_multiplier: float | None = None
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    # Qwen3: an RMSNorm (Phi: a LayerNorm; StableLM: a LayerNorm per head) over head_dim on every query and key head,
    # before the rotation
    qk_norm: bool = False
    output_bias: bool = False
    mlp_bias: bool = False
    # Per-layer sliding window in tokens (None: the layer sees every token); None: no windows.
    layer_windows: tuple[int | None, ...] | None = None
    hidden_act: str = "silu"
    layer_norm_eps: float = 1e-5
    layer_norm_before: bool = True  # OPT: False normalises each branch's sum (post-norm, OPT-350m)
    parallel_residual: bool = False  # GPT-NeoX: attention and MLP both read the block's input, added side by side
    embedding_dim: int | None = None  # OPT: a token embedding narrower than hidden_size, projected in and out
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    moe: MoEConfig | None = None
    mla: LatentAttentionConfig | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.layer_windows is not None and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers")
        if self.moe is not None and self.hidden_act not in ("silu", "swish"):
            raise ValueError(f"{self.architecture} activation {self.hidden_act!r} is not supported; ember's experts run silu")

    @property
    def embedding_width(self) -> int:
        """Width of the token embedding and of the LM head's input (OPT's may be narrower than hidden_size)."""
        return self.embedding_dim or self.hidden_size

    def for_context(self, max_model_len: int | None) -> ModelConfig:
        """This config run within a context of `max_model_len` tokens (None: the model's whole context).

        The rotary tables then cover only that context (a 128k-position model served at 4k keeps 4k rows), and LongRoPE
        takes its short factors when that context is within the original one, as vLLM chooses them.
        """
        if max_model_len is None:
            return self
        return replace(self, rotary_positions=min(max_model_len, self.max_position_embeddings))

    @property
    def rotary_table_positions(self) -> int:
        """How many positions the rotary tables hold."""
        return self.rotary_positions or self.max_position_embeddings

    def window_of(self, layer: int) -> int | None:
        """The sliding window of `layer` in tokens, or None when it attends to every token."""
        return None if self.layer_windows is None else self.layer_windows[layer]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token in float32 over all layers (2 * L * n_kv * d_h * 4)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4
