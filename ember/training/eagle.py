"""Train an EAGLE-style head on a frozen target by self-distillation.

A batch is `batch_size` windows of corpus tokens; the target runs once over them (no gradients)
and gives its final hidden states f_t. The head learns, at every position, f_(t+1) from
(f_t, embedding of x_(t+1)): the token the window holds there, the one f_(t+1) was computed
after. Two losses, as EAGLE has: the regression onto f_(t+1) (relative to the features' mean
square), and the cross-entropy of the LM head on the prediction against the target's own
distribution at t + 1 (at `positions_per_window` random positions: the LM head products are the
cost). Drafting feeds the head its own predictions, so training unrolls: step u > 0 reads the
previous step's predictions instead of the target's features (`unroll` steps, losses averaged).
The draft vocabulary is the `draft_vocab_size` tokens most frequent in the training tokens, then
the lowest ids.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ember.engine.spec.eagle_head import EagleHead, token_embeddings
from ember.engine.spec.medusa_heads import model_identity
from ember.training.distillation import (
    TargetForward,
    differentiable_lm_head,
    load_training_text,
    plot_training,
    train_with_progress,
)


@dataclass(frozen=True)
class EagleTrainingConfig:
    """How to train: steps, learning rate, batch shape, unrolled draft steps, draft vocabulary size."""

    steps: int = 200
    learning_rate: float = 3e-3
    batch_size: int = 4
    sequence_length: int = 128
    positions_per_window: int = 16
    steps_per_batch: int = 1  # optimizer steps on each batch's hidden states (new distillation positions each time)
    unroll: int = 2
    num_blocks: int = 2
    draft_vocab_size: int = 8192
    self_generated: int = 0  # train on this many of the target's own replies (distillation.self_generated_tokens); 0: the corpus
    reply_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("--steps must be at least 1")
        if not self.learning_rate > 0:
            raise ValueError("--lr must be positive")
        if self.batch_size < 1 or self.steps_per_batch < 1 or self.positions_per_window < 1:
            raise ValueError("--batch-size, --steps-per-batch and --positions-per-window must be at least 1")
        if not 1 <= self.unroll <= 8:
            raise ValueError("--unroll must be from 1 to 8")
        if self.sequence_length < self.unroll + 2:
            raise ValueError(f"--sequence-length must be at least --unroll + 2 = {self.unroll + 2}")
        if self.draft_vocab_size < 1:
            raise ValueError("--draft-vocab must be at least 1")
        if self.self_generated < 0 or self.reply_tokens < 1:
            raise ValueError("--self-generate must be at least 0 and --reply-tokens at least 1")


@dataclass
class TrainingLog:
    """Loss and top-1 agreement with the target at each unrolled draft step, per optimizer step."""

    losses: list[float] = field(default_factory=list)
    step_accuracy: list[list[float]] = field(default_factory=list)  # [optimizer step][draft step]


def draft_vocabulary(tokens: list[int], vocab_size: int, size: int) -> torch.Tensor:
    """The `size` ids most frequent in `tokens` (ties: lower id first), then the lowest unused ids; sorted."""
    size = min(size, vocab_size)
    counts = Counter(t for t in tokens if 0 <= t < vocab_size)
    chosen = [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]]
    seen = set(chosen)
    chosen.extend(t for t in range(vocab_size) if t not in seen)
    return torch.tensor(sorted(chosen[:size]), dtype=torch.long)


class EagleTrainer:
    """Holds the frozen target, its windows' forward, the head and its optimizer."""

    def __init__(self, target: torch.nn.Module, config: EagleTrainingConfig, vocab_ids: torch.Tensor) -> None:
        self.target = target.requires_grad_(False)
        self.config = config
        dtype = next(target.parameters()).dtype
        self.head = EagleHead(model_identity(target), vocab_ids, config.num_blocks).to(dtype)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=config.learning_rate, weight_decay=0.0)
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
        hidden, embeddings = torch.empty(0), torch.empty(0)
        for step in range(self.config.steps):
            if step % self.config.steps_per_batch == 0:
                starts = [self._random.randrange(len(tokens) - length + 1) for _ in range(self.config.batch_size)]
                windows = [tokens[s : s + length] for s in starts]
                hidden = self.forward.hidden(windows)
                with torch.no_grad():
                    embeddings = token_embeddings(self.target, torch.tensor(windows)).to(hidden.dtype)
            loss, accuracy = self.step(hidden, embeddings)
            log.losses.append(loss)
            log.step_accuracy.append(accuracy)
            if on_step is not None:
                on_step(step, loss)
        return log

    def step(self, hidden: torch.Tensor, embeddings: torch.Tensor) -> tuple[float, list[float]]:
        """One optimizer step on the target's hidden states [B, L, H] over token windows whose embeddings are
        `embeddings` [B, L, H]; returns the loss and the top-1 agreement with the target at each unrolled draft step."""
        scale = hidden.pow(2).mean()
        self.optimizer.zero_grad(set_to_none=True)
        length = hidden.shape[1]
        feature = hidden[:, :-1]  # f_u .. f_(L-2) at unroll step u = 0
        total = torch.zeros(())
        agreement = []
        for u in range(self.config.unroll):
            n = length - 1 - u
            predicted = self.head(feature[:, :n], embeddings[:, u + 1 : u + 1 + n])
            wanted = hidden[:, u + 1 : u + 1 + n]
            feature_loss = (predicted - wanted).pow(2).mean() / scale
            token_loss, matched = self._distillation(predicted, wanted)
            total = total + (token_loss + feature_loss) / self.config.unroll
            agreement.append(matched)
            feature = predicted[:, :-1]  # the next draft step reads this step's predictions
        total.backward()
        self.optimizer.step()
        return float(total.detach()), agreement

    def _distillation(self, predicted: torch.Tensor, wanted: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Cross-entropy of the LM head on `predicted` against the target's distribution from `wanted` at random
        positions, and the share of those positions whose argmax agrees."""
        count = predicted.shape[1]
        positions = torch.tensor(sorted(self._random.sample(range(count), min(count, self.config.positions_per_window))))
        with torch.no_grad():
            teacher = torch.softmax(self.target.compute_logits(wanted[:, positions].reshape(-1, wanted.shape[-1])).float(), -1)
        picked = predicted[:, positions].reshape(-1, predicted.shape[-1])
        log_probs = torch.log_softmax(torch.nn.functional.linear(picked, self.lm_head_weight).float(), dim=-1)
        loss = -(teacher * log_probs).sum(dim=-1).mean()
        return loss, float((log_probs.argmax(dim=-1) == teacher.argmax(dim=-1)).float().mean())


@dataclass(frozen=True)
class TrainedEagleHead:
    """Where the head went and how training went."""

    out: Path
    log: TrainingLog
    num_corpus_tokens: int


def train_eagle_head(
    model: str,
    corpus: list[Path],
    out: Path,
    config: EagleTrainingConfig,
    dtype: str = "float32",
    tokenizer: str | None = None,
    show_progress: bool = False,
) -> TrainedEagleHead:
    """Load `model`, read (or generate) its training tokens, and train a head for it (`train_eagle_head_for`)."""
    target, tokens = load_training_text(model, corpus, dtype, tokenizer, config, show_progress)
    return train_eagle_head_for(target, tokens, out, config, show_progress)


def train_eagle_head_for(
    target: torch.nn.Module, tokens: list[int], out: Path, config: EagleTrainingConfig, show_progress: bool = False
) -> TrainedEagleHead:
    """Train a head for a loaded model on `tokens` with a progress bar; save it (and a training plot) in `out`."""
    trainer = EagleTrainer(target, config, draft_vocabulary(tokens, target.config.vocab_size, config.draft_vocab_size))
    log = train_with_progress("eagle train", config.steps, lambda on_step: trainer.train(tokens, on_step), show_progress)
    trainer.head.save(out)
    agreement = {f"draft step {u + 1}": list(series) for u, series in enumerate(zip(*log.step_accuracy, strict=True))}
    plot_training(log.losses, agreement, "EAGLE-style head, self-distillation", out / "training.png")
    return TrainedEagleHead(out, log, len(tokens))
