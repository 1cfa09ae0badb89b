"""Train Medusa heads on a frozen target by self-distillation: each head learns the target's own next-token guesses.

A batch is `batch_size` windows of `sequence_length` corpus tokens. The target runs once over
them without gradients and gives its final (normed) hidden states and its own distribution at
every position. Head k at position t is taught the target's distribution at position t + k + 1
(its guess for token t + k + 2): what speculation must predict is the target's output, not the
corpus's, so these targets suit it better than the corpus labels. Only the heads get gradients;
the LM head is shared and frozen. Its products (teacher logits, the heads' logits and their
gradient) cost as much as the target's body on a small model, so the distillation loss reads a
random subset of `positions_per_window` positions per window. The target's forward is the other
cost: `steps_per_batch` > 1 reuses one batch's hidden states for several optimizer steps, each
distilling other positions. Every position still teaches the
heads through a cheap second loss, as EAGLE does: head k's output regresses onto the target's own
hidden state at t + k + 1 (the vector the LM head turns into the wanted distribution), its
mean squared error relative to the hidden states' mean square.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ember.engine.spec.medusa_heads import MedusaHeads, model_identity
from ember.training.distillation import (
    TargetForward,
    differentiable_lm_head,
    load_training_text,
    plot_training,
    train_with_progress,
)

FEATURE_LOSS_WEIGHT = 1.0  # weight of the hidden-state regression beside the distillation loss


@dataclass(frozen=True)
class MedusaTrainingConfig:
    """How to train: how many heads, steps, learning rate and the shape of a batch."""

    num_heads: int = 4
    steps: int = 200
    learning_rate: float = 3e-3
    batch_size: int = 4
    sequence_length: int = 128
    positions_per_window: int = 16  # positions per window whose logits are trained (the LM head products' cost)
    steps_per_batch: int = 1  # optimizer steps on each batch's hidden states (new distillation positions each time)
    self_generated: int = 0  # train on this many of the target's own replies (distillation.self_generated_tokens); 0: the corpus
    reply_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.num_heads <= 16:
            raise ValueError("--num-heads must be from 1 to 16")
        if self.steps < 1:
            raise ValueError("--steps must be at least 1")
        if not self.learning_rate > 0:
            raise ValueError("--lr must be positive")
        if self.batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        if self.sequence_length < self.num_heads + 2:
            raise ValueError(f"--sequence-length must be at least --num-heads + 2 = {self.num_heads + 2}")
        if self.steps_per_batch < 1:
            raise ValueError("--steps-per-batch must be at least 1")
        if self.positions_per_window < 1:
            raise ValueError("--positions-per-window must be at least 1")
        if self.self_generated < 0 or self.reply_tokens < 1:
            raise ValueError("--self-generate must be at least 0 and --reply-tokens at least 1")

    @property
    def num_trained_positions(self) -> int:
        """Positions t of a window that have a target for every head (t + num_heads inside the window)."""
        return self.sequence_length - self.num_heads


@dataclass
class TrainingLog:
    """Loss and top-1 agreement with the target of each head, per step."""

    losses: list[float] = field(default_factory=list)
    head_accuracy: list[list[float]] = field(default_factory=list)  # [step][head]


class MedusaTrainer:
    """Holds the frozen target, its runner for full-window forwards, the heads and their optimizer."""

    def __init__(self, target: torch.nn.Module, config: MedusaTrainingConfig) -> None:
        self.target = target.requires_grad_(False)
        self.config = config
        self.heads = MedusaHeads(config.num_heads, model_identity(target)).to(next(target.parameters()).dtype)
        self.optimizer = torch.optim.AdamW(self.heads.parameters(), lr=config.learning_rate, weight_decay=0.0)
        self.lm_head_weight = differentiable_lm_head(target)
        self.forward = TargetForward(target, config.batch_size, config.sequence_length)
        self._random = random.Random(config.seed)

    def train(self, tokens: list[int], on_step: Callable[[int, float], None] | None = None) -> TrainingLog:
        """`config.steps` optimizer steps on random windows of `tokens`; `on_step(step, loss)` after each."""
        length = self.config.sequence_length
        if len(tokens) < length:
            raise ValueError(
                f"the corpus gave {len(tokens)} tokens but one training window needs {length}; "
                "give more text or a smaller --sequence-length"
            )
        log = TrainingLog()
        hidden = torch.empty(0)
        for step in range(self.config.steps):
            if step % self.config.steps_per_batch == 0:
                starts = [self._random.randrange(len(tokens) - length + 1) for _ in range(self.config.batch_size)]
                hidden = self.forward.hidden([tokens[s : s + length] for s in starts])
            loss, accuracy = self.step(hidden)
            log.losses.append(loss)
            log.head_accuracy.append(accuracy)
            if on_step is not None:
                on_step(step, loss)
        return log

    def step(self, hidden: torch.Tensor) -> tuple[float, list[float]]:
        """One optimizer step on the target's hidden states [B, L, H] of a batch of windows; returns the loss
        and each head's top-1 agreement with the target.

        Heads are back-propagated one at a time (they share no gradient path), so only one head's
        [batch, positions, vocab] logits are alive at once."""
        count = self.config.num_trained_positions
        positions = self._positions()
        teacher = self._teacher_probs(hidden, positions)  # [B, P, K, V]
        scale = hidden.pow(2).mean()
        self.optimizer.zero_grad(set_to_none=True)
        total, agreement = 0.0, []
        for k, block in enumerate(self.heads.blocks):
            out = block(hidden[:, :count])  # head k at every trained position t: [B, T, H]
            # The target's own hidden state at t + k + 1 is what its LM head turns into the wanted distribution.
            feature_loss = (out - hidden[:, k + 1 : k + 1 + count]).pow(2).mean() / scale
            picked = out[:, positions].reshape(-1, out.shape[-1])
            log_probs = torch.log_softmax(torch.nn.functional.linear(picked, self.lm_head_weight).float(), dim=-1)
            target_probs = teacher[:, :, k].reshape(log_probs.shape)
            token_loss = -(target_probs * log_probs).sum(dim=-1).mean()
            loss = (token_loss + FEATURE_LOSS_WEIGHT * feature_loss) / self.heads.num_heads
            loss.backward()
            total += loss.item()
            agreement.append(float((log_probs.argmax(dim=-1) == target_probs.argmax(dim=-1)).float().mean()))
        self.optimizer.step()
        return total, agreement

    def _positions(self) -> torch.Tensor:
        """Window positions whose logits are trained this step: a random subset of those with a target for every head."""
        count = self.config.num_trained_positions
        wanted = self.config.positions_per_window
        if wanted >= count:
            return torch.arange(count)
        return torch.tensor(sorted(self._random.sample(range(count), wanted)))

    @torch.no_grad()
    def _teacher_probs(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The target's distribution at t + k + 1 for each trained position t and head k: [B, P, K, V]."""
        offsets = torch.arange(1, self.config.num_heads + 1)
        needed = torch.unique(positions.unsqueeze(1) + offsets)  # sorted
        logits = self.target.compute_logits(hidden[:, needed].reshape(-1, hidden.shape[-1])).float()
        probs = torch.softmax(logits, dim=-1).reshape(hidden.shape[0], len(needed), -1)
        return probs[:, torch.searchsorted(needed, positions.unsqueeze(1) + offsets)]


@dataclass(frozen=True)
class TrainedHeads:
    """Where the heads went and how training went."""

    out: Path
    log: TrainingLog
    num_corpus_tokens: int


def train_medusa_heads(
    model: str,
    corpus: list[Path],
    out: Path,
    config: MedusaTrainingConfig,
    dtype: str = "float32",
    tokenizer: str | None = None,
    show_progress: bool = False,
) -> TrainedHeads:
    """Load `model`, read (or generate) its training tokens, and train heads for it (`train_heads_for`)."""
    target, tokens = load_training_text(model, corpus, dtype, tokenizer, config, show_progress)
    return train_heads_for(target, tokens, out, config, show_progress)


def train_heads_for(
    target: torch.nn.Module, tokens: list[int], out: Path, config: MedusaTrainingConfig, show_progress: bool = False
) -> TrainedHeads:
    """Train heads for a loaded model on `tokens` with a progress bar; save them (and a training plot) in `out`."""
    trainer = MedusaTrainer(target, config)
    log = train_with_progress("medusa train", config.steps, lambda on_step: trainer.train(tokens, on_step), show_progress)
    trainer.heads.save(out)
    agreement = {f"head {u + 1} (token t+{u + 2})": list(series) for u, series in enumerate(zip(*log.head_accuracy, strict=True))}
    plot_training(log.losses, agreement, "Medusa heads, self-distillation", out / "training.png")
    return TrainedHeads(out, log, len(tokens))
