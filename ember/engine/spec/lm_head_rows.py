"""The target's LM head as a dense matrix, read through its own `compute_logits`, for draft heads.

Medusa and EAGLE-style heads produce hidden states that the target's LM head turns into tokens: training
needs that head as a differentiable product, and EAGLE's drafting reads its rows for a draft vocabulary.
Reading the rows as the logits of unit inputs covers every head the same way: a float head, a quantized
one (its dequantized rows), a family's logit scaling (Granite) or a tied embedding. A head that is not a
linear product (Gemma 2's soft cap) is refused rather than learned against the wrong function.
"""

from __future__ import annotations

import torch
from torch import nn

LINEARITY_TOLERANCE = 1e-3  # relative: the LM head's rows must reproduce its logits
# The head's rows are read through products of this many rows, as a decode step runs them: a product of many rows
# may take another path (AMX tiles round GGML weights to bfloat16) and give rounded rows.
DECODE_ROWS = 16


def lm_head_rows(target: nn.Module, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The LM head's rows [len(vocab_ids) or vocab, hidden] in float32, such that logits = hidden @ rows.T; raises
    unless the target's logits are that product."""
    hidden_size = target.config.embedding_width  # what compute_logits reads (OPT: its embedding width)
    dtype = next(target.parameters()).dtype
    identity = torch.eye(hidden_size, dtype=dtype)
    with torch.inference_mode():  # W^T [hidden, vocab], read in decode-sized products (a many-row one may round W)
        columns = torch.cat([target.compute_logits(identity[start : start + DECODE_ROWS]).float()
                             for start in range(0, hidden_size, DECODE_ROWS)])
        probe = _unrounded_probe(hidden_size).to(dtype).unsqueeze(0)
        expected = target.compute_logits(probe).float()[0]
    product = probe.float()[0] @ columns
    if (product - expected).abs().max() > LINEARITY_TOLERANCE * (expected.abs().max() + 1.0):
        raise ValueError(f"{type(target).__name__}'s logits are not a plain LM head product (a soft cap?); "
                         "draft heads cannot be trained for it or draft with it: use --speculative-method ngram or draft")
    rows = columns if vocab_ids is None else columns[:, vocab_ids]
    return rows.t().contiguous()


def _unrounded_probe(size: int) -> torch.Tensor:
    """A probe input a quantized head's int8 activations hold exactly (multiples of 1/127, every 32 values reaching
    1): the linearity check then sees the head's function, not its input rounding."""
    probe = torch.round(torch.sin(torch.arange(size, dtype=torch.float32) * 0.61 + 0.3) * 127) / 127
    probe[::32] = 1.0
    return probe
