"""After loading: put a model's weights in the form the CPU kernels read, in one place.

1. Every ember `Linear` packs its weight into panels (the dense copy goes away).
2. A tied embedding whose head got packed reads its rows from the head's panels: one copy.
3. bfloat16 weights with every product packed: the decoder computes in float32 (the embedding
   hands out float32 rows), so no elementwise op runs in bfloat16 and no product converts its
   input; the weights and the KV cache stay bfloat16, read at half the bytes.
4. Decoder layers that can (`CompilableLayer`) run as one compiled call each (quantized GGML
   products too: they need no packing).
Where the kernels are unavailable nothing changes and torch runs the model as loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.layers.cpu_decoder_layer import CompilableLayer
from ember.layers.embedding import VocabEmbedding
from ember.layers.linear import Linear, pack_linear_weights
from ember.layers.norm import RMSNorm


def prepare_for_cpu_kernels(model: nn.Module, tied_weights: dict[str, str]) -> None:
    """Pack, share the tied table, pick the compute dtype (see the module docstring)."""
    if pack_linear_weights(model) > 0:
        _share_tied_tables(model, tied_weights)
    if _every_product_packed_in(model, torch.bfloat16):
        for module in model.modules():
            if isinstance(module, VocabEmbedding):
                module.output_dtype = torch.float32
    for module in model.modules():
        if isinstance(module, CompilableLayer):
            module.compile_for_cpu()


def _share_tied_tables(model: nn.Module, tied_weights: dict[str, str]) -> None:
    modules = dict(model.named_modules())
    for head_name, table_name in tied_weights.items():
        head = modules.get(head_name.removesuffix(".weight"))
        table = modules.get(table_name.removesuffix(".weight"))
        if isinstance(head, Linear) and head.packed is not None and isinstance(table, VocabEmbedding):
            table.read_from_packed_head(head)


def _every_product_packed_in(model: nn.Module, dtype: torch.dtype) -> bool:
    """All products packed with `dtype` panels, and no other module holding tensors (an unpacked
    linear, an expert bank, a quantized layer) that would meet float32 inputs with its own dtype."""
    for module in model.modules():
        if isinstance(module, Linear):
            is_safe = module.packed is not None and module.packed.dtype == dtype
        else:
            owns_tensors = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
            is_safe = isinstance(module, (RMSNorm, VocabEmbedding)) or not owns_tensors
        if not is_safe:
            return False
    return True


def restore_dense_weights(model: nn.Module) -> None:
    """Undo the packing: dense nn.Linear / nn.Embedding weights again (for code that edits weights in place)."""
    for module in model.modules():
        if isinstance(module, CompilableLayer):
            module.drop_compiled()
        if isinstance(module, Linear) and module.packed is not None:
            packed, module.packed = module.packed, None
            module.weight = nn.Parameter(packed.dense().clone(), requires_grad=False)
            if packed.bias is not None:
                module.bias = nn.Parameter(packed.bias[: packed.out_features].to(packed.dtype), requires_grad=False)
        elif isinstance(module, VocabEmbedding):
            if module.packed_table is not None:
                table, module.packed_table = module.packed_table, None
                module.weight = nn.Parameter(table.dense().clone(), requires_grad=False)
            module.output_dtype = None
