"""Logits from int8 activations, made float32-exact for every token that could be the row's largest.

The LM head is the widest product of a step (151,936 x 1,536 on Qwen2.5-1.5B): over GGML blocks with float32
activations it decodes the blocks once per row (measured: 115 ms for 16 rows of that Q6_K head, 35 ms with int8
activations in the interleaved layout). int8 activations (per 32 values, as llama.cpp rounds them) move a logit by
up to ~0.5 on SmolLM2, which flipped 1 greedy choice in 24 against the float32 product there. So the head computes
every logit with int8 activations and then recomputes in float32 the few logits that could be the row's largest:

    |w . x - w . r(x)| = |w . (x - r(x))| <= ||w|| ||x - r(x)||    (Cauchy-Schwarz; r rounds x per 32 values)

plus the two products' float32 summation slack. A token whose upper bound stays under the row's best lower bound is
not the float32 argmax; every other one (a median of 11 of SmolLM2's 49,152 on text, 251 at most in that sample) is
recomputed, so a greedy choice is the float32 product's. The other logits keep int8's values.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Float32 summation error of an n-term dot product is at most about n * 2^-24 * ||w|| ||x||; two products (int8 and
# float32) each contribute it, and the scales and rounded values add their own last-bit errors: 4 covers them.
SUMMATION_SLACK_PER_TERM = 4 * 2.0**-24
NORM_MARGIN = 1 + 1e-5  # the stored row norms are float32 sums themselves: never let one undershoot


def row_norms(dequantized_rows: Callable[[int, int], torch.Tensor], num_rows: int, chunk_rows: int = 2048) -> torch.Tensor:
    """||w_j|| of every row (float32, rounded up), from `dequantized_rows(start, stop)` chunks (the whole weight never
    exists in float32 at once)."""
    norms = torch.empty(num_rows, dtype=torch.float32)
    for start in range(0, num_rows, chunk_rows):
        stop = min(start + chunk_rows, num_rows)
        norms[start:stop] = torch.linalg.vector_norm(dequantized_rows(start, stop).double(), dim=1).float()
    return norms * NORM_MARGIN


def refine_near_top(
    logits: torch.Tensor,
    x: torch.Tensor,
    rounded_x: torch.Tensor,
    norms: torch.Tensor,
    exact_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> int:
    """Replace, in place, the int8-activation `logits` [m, vocab] of every token that could be some row's float32
    argmax by `exact_logits(x, token_ids)` ([m, len(token_ids)], float32 activations); returns how many tokens.

    `x` [m, cols] is the head's float32 input, `rounded_x` the values the int8 product used, `norms` the rows' ||w||.
    Token j's float32 logit lies within c ||w_j|| of its int8 logit (c: the row's rounding error norm plus slack); it
    can be the argmax only if its upper bound reaches the row's best lower bound. That test runs on the few columns
    within 2 c max||w|| of some row's top (one cheap pass over the logits finds them); a column that passes for any
    row is recomputed for every row (a median of 1 token per row on SmolLM2 and Qwen2.5-1.5B text)."""
    c = torch.linalg.vector_norm(x - rounded_x, dim=1) + SUMMATION_SLACK_PER_TERM * x.shape[1] * torch.linalg.vector_norm(x, dim=1)
    reach = c[:, None] * norms.max()
    near = ((logits - logits.amax(dim=1, keepdim=True) + 2 * reach).amax(dim=0) >= 0).nonzero().flatten()
    bound = c[:, None] * norms[near]
    picked = logits[:, near]
    could_win = (picked + bound >= (picked - bound).amax(dim=1, keepdim=True)).any(dim=0)
    wanted = near[could_win]
    logits[:, wanted] = exact_logits(x, wanted).to(logits.dtype)
    return wanted.numel()
