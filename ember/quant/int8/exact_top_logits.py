"""Logits from int8 activations, made float32-exact for every token that could be the row's largest.

The LM head is the widest product of a step (151,936 x 1,536 on Qwen2.5-1.5B): over GGML blocks with float32
activations it decodes the blocks once per row (measured: 115 ms for 16 rows of that Q6_K head, 35 ms with int8
activations in the interleaved layout). int8 activations (per 32 values, as llama.cpp rounds them) move a logit by
up to ~0.5 on SmolLM2, which flipped 1 greedy choice in 24 against the float32 product there. So the head computes
every logit with int8 activations and then recomputes in float32 the few logits that could be the row's largest:

    |w . x - w . r(x)| = |w . (x - r(x))| <= ||w|| ||x - r(x)||    (Cauchy-Schwarz; r rounds x per 32 values)

plus the two products' float32 summation slack (a product of many rows on AMX tiles rounds x and w to bfloat16
instead: the bound then adds the weights' rounding, see `refine_near_top`). A token whose upper bound stays under the row's best lower bound is
not the float32 argmax; every other one (measured on 78 decode rows of text: a median of 1 per row on SmolLM2 and
Qwen2.5-1.5B, at most ~20) is recomputed, so a greedy choice is the float32 product's. The other logits keep int8's values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

# Float32 summation error of an n-term dot product is at most about n * 2^-24 * ||w|| ||x||; two products (int8 and
# float32) each contribute it, and the scales and rounded values add their own last-bit errors: 4 covers them.
SUMMATION_SLACK_PER_TERM = 4 * 2.0**-24
BFLOAT16_UNIT_ROUNDOFF = 2.0**-8  # |v - bfloat16(v)| <= 2^-8 |v|: round to nearest with 8 significant bits
# Rows whose candidate tokens are recomputed together (each for all of them): a decode batch in one call; a whole
# prompt's rows (perplexity) in blocks, so the recomputed columns stay those of a few rows.
ROWS_PER_RECOMPUTATION = 16


def row_norms(dequantized_rows: Callable[[int, int], torch.Tensor], num_rows: int, chunk_rows: int = 2048) -> torch.Tensor:
    """||w_j|| of every row (float32, rounded up), from `dequantized_rows(start, stop)` chunks (the whole weight never
    exists in float32 at once)."""
    norms = torch.empty(num_rows, dtype=torch.float32)
    cols = 0
    for start in range(0, num_rows, chunk_rows):
        stop = min(start + chunk_rows, num_rows)
        rows = dequantized_rows(start, stop)
        norms[start:stop], cols = torch.linalg.vector_norm(rows, dim=1), rows.shape[1]
    return norms * (1 + SUMMATION_SLACK_PER_TERM * cols)  # a float32 sum of squares may undershoot by ~cols * 2^-24


def refine_near_top(
    logits: torch.Tensor,
    x: torch.Tensor,
    rounded_x: torch.Tensor,
    norms: torch.Tensor,
    exact_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    weight_rounding: float = 0.0,
) -> int:
    """Replace, in place, the int8-activation `logits` [m, vocab] of every token that could be its row's float32
    argmax by `exact_logits(x_rows, token_ids)` ([rows, len(token_ids)], float32 activations); returns how many
    (row-block, token) pairs were recomputed.

    `x` [m, cols] is the head's float32 input, `rounded_x` the values the product used, `norms` the rows' ||w||;
    `weight_rounding` bounds the relative rounding of the weights the product used (0: exact; a many-row product on
    AMX tiles rounds them to bfloat16: |w - w~| <= 2^-8 |w|, so |w.x - w~.x~| <= ||w|| (||x - x~|| + 2^-8 ||x~||)).
    Rows go ROWS_PER_RECOMPUTATION at a time (a whole prompt's logits, as perplexity asks for, stays a few small
    recomputations instead of every row times every row's candidates)."""
    c = torch.linalg.vector_norm(x - rounded_x, dim=1) + SUMMATION_SLACK_PER_TERM * x.shape[1] * torch.linalg.vector_norm(x, dim=1)
    if weight_rounding:
        c += weight_rounding * torch.linalg.vector_norm(rounded_x, dim=1)
    largest_norm = float(norms.max())
    replaced = 0
    for start in range(0, logits.shape[0], ROWS_PER_RECOMPUTATION):
        rows = slice(start, start + ROWS_PER_RECOMPUTATION)
        replaced += _refine_rows(logits[rows], x[rows], c[rows], norms, largest_norm, exact_logits)
    return replaced


def _refine_rows(logits: torch.Tensor, x: torch.Tensor, c: torch.Tensor, norms: torch.Tensor, largest_norm: float,
                 exact_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> int:
    """`refine_near_top` for a few rows (`logits` a view into the whole): token j's float32 logit lies within
    c ||w_j|| of its int8 logit, so it can be the argmax only if its upper bound reaches the row's best lower bound.
    That test runs on the columns within 2 c max||w|| of some row's top (one cheap pass finds them); a column that
    passes for any of the rows is recomputed for all of them (a median of 1 token per row on SmolLM2 and Qwen2.5-1.5B
    text). The selection runs in numpy on views of the tensors: a decode step's one row costs a third of what the same
    dozen torch calls cost."""
    values, reach = logits.numpy(), c.numpy()[:, None]
    near = np.flatnonzero((values >= values.max(axis=1, keepdims=True) - 2 * largest_norm * reach).any(axis=0))
    picked, bound = values[:, near], reach * norms.numpy()[near]
    could_win = (picked + bound >= (picked - bound).max(axis=1, keepdims=True)).any(axis=0)
    wanted = torch.from_numpy(near[could_win])
    logits[:, wanted] = exact_logits(x, wanted).to(logits.dtype)
    return wanted.numel()
