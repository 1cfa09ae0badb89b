"""Mixture-of-experts GGUFs against transformers: qwen2moe (a sigmoid-gated shared expert, a dense first layer),
qwen3moe (per-head q/k norms, a dense last layer) and a "llama" file with experts (Mixtral, llama.cpp's q/k row
order). Each file stacks a layer's expert matrices in 3-D tensors, which ember splits per expert."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.numpy import load_file

from ember.config.model import ModelConfig
from ember.gguf_file import GGUFFile
from ember.models.gguf_loader import read_gguf_config
from ember.models.hf_loader import read_hf_config
from ember.models.loader import load_model
from ember.quant.ggml.layers import GGMLLinear
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    single_thread_torch,
)
from tests.models.test_gguf_loader import (
    _greedy_tokens,
    _llama_cpp_permute,
    add_shape_metadata,
    finish_gguf,
)
from tests.parallel.moe_models import VOCAB, save_mixtral, save_qwen2_moe, save_qwen3_moe

pytestmark = pytest.mark.usefixtures("single_thread_torch")

T = GGMLQuantizationType
SAVERS = {"qwen2moe": save_qwen2_moe, "qwen3moe": save_qwen3_moe, "llama": save_mixtral}
# transformers' per-layer names -> llama.cpp's (experts handled apart: they are stacked)
_LAYER_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip
_EXPERT_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_GLOBALS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def _gguf_tensors(folder: Path, arch: str, config: ModelConfig) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under llama.cpp's names, each layer's experts stacked [expert, rows, cols]."""
    tensors, experts = {}, {}
    for name, values in load_file(folder / "model.safetensors").items():
        if name in _GLOBALS:
            tensors[_GLOBALS[name]] = values
            continue
        _, _, layer, rest = name.split(".", 3)
        rest, kind = rest.rsplit(".", 1)
        if ".experts." in rest:
            index, part = rest.split(".experts.")[1].split(".")
            experts.setdefault((layer, _EXPERT_PARTS[part]), {})[int(index)] = values
            continue
        if arch == "llama" and rest in ("self_attn.q_proj", "self_attn.k_proj"):
            values = _llama_cpp_permute(values, config.num_heads if rest.endswith("q_proj") else config.num_kv_heads)
        tensors[f"blk.{layer}.{_LAYER_PARTS[rest]}.{kind}"] = values.reshape(-1) if rest == "mlp.shared_expert_gate" else values
    for (layer, part), stack in experts.items():
        tensors[f"blk.{layer}.ffn_{part}_exps.weight"] = np.stack([stack[i] for i in range(len(stack))])
    return tensors


def write_moe_gguf(folder: Path, path: Path, arch: str, qtype: GGMLQuantizationType) -> None:
    """`folder`'s MoE checkpoint as an `arch` GGUF: matrices (experts included) in `qtype`, norms, routers and rows
    that are not whole blocks float32 (as llama.cpp's converter falls back)."""
    config = read_hf_config(folder)
    writer = GGUFWriter(str(path), arch)
    add_shape_metadata(writer, load_reference(folder).config)
    writer.add_key_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_expert_count(config.moe.num_experts)
    writer.add_expert_used_count(config.moe.num_experts_per_token)
    if arch != "llama":
        writer.add_expert_feed_forward_length(config.moe.expert_intermediate_size)
    if config.moe.shared_intermediate_size:
        writer.add_expert_shared_feed_forward_length(config.moe.shared_intermediate_size)
    for name, values in _gguf_tensors(folder, arch, config).items():
        if values.ndim == 1 or "gate_inp" in name or qtype == T.F32 or values.shape[-1] % 32:
            writer.add_tensor(name, values.astype(np.float32))
        else:
            raw = quantize(values.astype(np.float32), qtype)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    finish_gguf(writer)


@pytest.fixture(scope="module", params=list(SAVERS), ids=list(SAVERS))
def moe_checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    arch = request.param
    return arch, SAVERS[arch](tmp_path_factory.mktemp(arch))


def test_a_moe_gguf_reads_the_config_of_its_checkpoint(moe_checkpoint, tmp_path):
    arch, folder = moe_checkpoint
    write_moe_gguf(folder, tmp_path / "model.gguf", arch, T.F32)
    ours, theirs = read_gguf_config(GGUFFile.open(tmp_path / "model.gguf")), read_hf_config(folder)
    assert ours.architecture == theirs.architecture and ours.moe == theirs.moe  # dense layers found by their missing router
    assert (ours.qkv_bias, ours.qk_norm) == (theirs.qkv_bias, theirs.qk_norm)


def test_a_float_moe_gguf_matches_transformers(moe_checkpoint, tmp_path):
    arch, folder = moe_checkpoint
    write_moe_gguf(folder, tmp_path / "model.gguf", arch, T.F32)
    assert_prompt_logits_match(tmp_path / "model.gguf", load_reference(folder), make_prompts(VOCAB))


def test_a_q8_0_moe_gguf_runs_its_experts_in_blocks_and_generates_what_its_float_copy_generates(moe_checkpoint, tmp_path):
    arch, folder = moe_checkpoint
    path = tmp_path / "model.gguf"
    write_moe_gguf(folder, path, arch, T.Q8_0)
    model = load_model(path, dtype="auto").model
    in_blocks = {name for name, module in model.named_modules() if isinstance(module, GGMLLinear)}
    assert any(".experts.5." in name for name in in_blocks)
    tokens = _greedy_tokens(path, "auto", "float32")
    assert len(tokens) == 10 and tokens == _greedy_tokens(path, "float32", "float32")
