"""Tiny random-weight checkpoints built with transformers, saved as safetensors folders."""

from __future__ import annotations

from pathlib import Path

import torch

TINY_SHAPE = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def save_tiny_model(family: str, folder: Path, seed: int = 0, **overrides) -> Path:
    """A random `family` ("llama", "qwen2", "qwen3", "mistral", "phi3", "smollm3", "granite", "olmo2", "gemma2", "gpt2",
    "mixtral", "deepseek_v2") model in `folder`; returns the folder."""
    import transformers

    config_classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
        "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM),
        "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "deepseek_v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM),
    }
    config_class, model_class = config_classes[family]
    settings = dict(TINY_SHAPE, rope_theta=10000.0, tie_word_embeddings=False)
    if family in ("mistral", "phi3"):
        settings["sliding_window"] = None
    if family == "phi3":  # its defaults name token 32000, outside a tiny vocabulary
        settings.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "granite":  # its four scalars away from 1 (Granite 3's: 12, 1/64 and 0.22, 8 in the 2B)
        settings.update(embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.3, logits_scaling=4.0)
    if family == "olmo2":  # its defaults name tokens past a tiny vocabulary
        settings.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gemma2":  # alternating sliding-window and global layers: two KV layer groups
        settings.update(head_dim=16, sliding_window=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gpt2":  # its own names for the shape; learned positions, no rotary
        shape = {k: settings.pop(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")}
        for unused in ("intermediate_size", "num_key_value_heads", "rope_theta"):
            settings.pop(unused)
        settings.update(n_embd=shape["hidden_size"], n_layer=shape["num_hidden_layers"], n_head=shape["num_attention_heads"],
                        n_positions=shape["max_position_embeddings"], bos_token_id=1, eos_token_id=2)
    if family == "mixtral":  # four experts, two per token, stored one by one as w1 / w2 / w3
        settings.update(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    if family == "deepseek_v2":  # MLA (a 32-wide latent), a dense first layer, then routed and shared experts
        settings.update(num_key_value_heads=settings["num_attention_heads"], n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
                        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    if family == "smollm3":  # two layers: the second without rotary positions (NoPE), as every fourth in SmolLM3-3B
        settings.update(no_rope_layers=[1, 0], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = model_class(config_class(**settings)).eval()
    with torch.no_grad():  # make the random weights less uniform so logits spread out
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def load_reference(folder: Path):
    """The transformers model saved in `folder`, float32, eval mode."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def save_random_adapter(base: Path, folder: Path, targets: list[str], rank: int = 8, seed: int = 0,
                        safe_serialization: bool = True, **options) -> Path:
    """A PEFT LoRA adapter of `base` over `targets` with random A and B (peft starts B at zero), saved by peft."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_reference(base), LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, **options))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    model.save_pretrained(folder, safe_serialization=safe_serialization)
    return folder
