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

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ember.engine.request import Request, Sequence
from ember.engine.runner import ModelRunner
from ember.engine.sampling_params import SamplingParams
from ember.engine.scheduler import ScheduledSequence, SchedulerOutput
from ember.engine.spec.medusa_heads import MedusaHeads, model_identity
from ember.kv.cache_manager import KVCacheManager
from ember.layers.sampler import Sampler
from ember.tokenizers.base import Tokenizer

CHARS_PER_TOKEN_BOUND = 8  # corpus text read per token needed: English BPE averages about 4 characters a token
BLOCK_SIZE = 16
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

    @property
    def num_trained_positions(self) -> int:
        """Positions t of a window that have a target for every head (t + num_heads inside the window)."""
        return self.sequence_length - self.num_heads


@dataclass
class TrainingLog:
    """Loss and top-1 agreement with the target of each head, per step."""

    losses: list[float] = field(default_factory=list)
    head_accuracy: list[list[float]] = field(default_factory=list)  # [step][head]


def corpus_tokens(paths: list[Path], tokenizer: Tokenizer, num_tokens: int) -> list[int]:
    """About `num_tokens` tokens from the corpus files (a share of each), concatenated; raises when they hold too few."""
    _check_corpus(paths)
    chars_each = math.ceil(num_tokens * CHARS_PER_TOKEN_BOUND / len(paths))
    tokens: list[int] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            tokens.extend(tokenizer.encode(f.read(chars_each), add_special_tokens=False))
    return tokens


def differentiable_lm_head(target: torch.nn.Module) -> torch.Tensor:
    """The dense LM head weight [vocab, hidden], checked to give the target's own logits.

    The loaded head runs through a compiled kernel without autograd; the heads' gradient goes
    through this dense copy instead. A family whose logits are more than that product (a soft
    cap), or a quantized head, is refused rather than trained against the wrong function.
    """
    weight = target.lm_head.state_dict().get("weight")
    if weight is None or not weight.is_floating_point():
        raise ValueError("Medusa training needs a float LM head; load the model with --dtype float32 (or bfloat16)")
    weight = weight.detach()
    probe = torch.sin(torch.arange(weight.shape[1], dtype=torch.float32)).to(weight.dtype).unsqueeze(0)
    with torch.inference_mode():
        expected = target.compute_logits(probe).float()
    if not torch.allclose(torch.nn.functional.linear(probe, weight).float(), expected, rtol=1e-3, atol=1e-3):
        raise ValueError(f"{type(target).__name__}'s logits are not a plain LM head product; Medusa training does not support it")
    return weight


def _check_corpus(paths: list[Path]) -> None:
    if not paths:
        raise ValueError("give at least one corpus file (--corpus FILE)")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist; give text files to train on (--corpus FILE)")


class MedusaTrainer:
    """Holds the frozen target, its runner for full-window forwards, the heads and their optimizer."""

    def __init__(self, target: torch.nn.Module, config: MedusaTrainingConfig) -> None:
        self.target = target.requires_grad_(False)
        self.config = config
        self.heads = MedusaHeads(config.num_heads, model_identity(target)).to(next(target.parameters()).dtype)
        self.optimizer = torch.optim.AdamW(self.heads.parameters(), lr=config.learning_rate, weight_decay=0.0)
        self.lm_head_weight = differentiable_lm_head(target)
        blocks_per_window = -(-config.sequence_length // BLOCK_SIZE)
        num_blocks = config.batch_size * blocks_per_window
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=False)
        self.runner = ModelRunner(target, num_blocks, BLOCK_SIZE, self.kv, Sampler(torch.Generator()), frozenset())
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
                hidden = self._target_hidden([tokens[s : s + length] for s in starts])
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

    def _target_hidden(self, windows: list[list[int]]) -> torch.Tensor:
        """The target's final hidden states over each window, as a fresh prefill: [B, L, H]."""
        scheduled = []
        for i, window in enumerate(windows):
            seq_id = f"medusa-train-{i}"
            seq = Sequence(seq_id, Request(seq_id, window, SamplingParams(max_tokens=1)), 0, list(window), len(window))
            if self.kv.allocate_slots(seq_id, window, 0, len(window)) is None:
                raise RuntimeError("the training KV cache is sized for one batch of windows and must have room")
            scheduled.append(ScheduledSequence(seq, len(window)))
        try:
            hidden = self.runner.hidden_states(SchedulerOutput(scheduled))
        finally:
            for item in scheduled:
                self.kv.free(item.seq.seq_id)
        return hidden.clone().reshape(len(windows), len(windows[0]), -1)  # a normal tensor, usable by autograd


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
    """Load `model` and train heads for it (`train_heads_for`)."""
    from ember.engine.llm_engine import load_tokenizer_from
    from ember.models.loader import load_model
    from ember.models.registry import resolve_model

    _check_corpus(corpus)
    loaded = load_model(resolve_model(model), dtype, show_progress=show_progress)
    text_tokenizer = load_tokenizer_from(Path(tokenizer) if tokenizer else loaded.tokenizer_path)
    if text_tokenizer is None:
        raise ValueError(f"{model} carries no tokenizer to read the corpus with; pass --tokenizer FILE")
    return train_heads_for(loaded.model, text_tokenizer, corpus, out, config, show_progress)


def train_heads_for(
    target: torch.nn.Module,
    tokenizer: Tokenizer,
    corpus: list[Path],
    out: Path,
    config: MedusaTrainingConfig,
    show_progress: bool = False,
) -> TrainedHeads:
    """Train heads for a loaded model on `corpus` with a progress bar; save them (and a training plot) in `out`."""
    trainer = MedusaTrainer(target, config)
    num_batches = -(-config.steps // config.steps_per_batch)
    tokens = corpus_tokens(corpus, tokenizer, num_batches * config.batch_size * config.sequence_length)
    columns = (TextColumn("[bold]medusa train"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
               TimeRemainingColumn())
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task("train", total=config.steps, loss="-")
        log = trainer.train(tokens, lambda step, loss: progress.update(task, completed=step + 1, loss=f"{loss:.3f}"))
    trainer.heads.save(out)
    plot_training(log, out / "training.png")
    return TrainedHeads(out, log, len(tokens))


def plot_training(log: TrainingLog, path: Path) -> Path:
    """Loss and each head's top-1 agreement with the target, per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_axis, agreement_axis) = plt.subplots(1, 2, figsize=(9, 3.4))
    loss_axis.plot(log.losses)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss")
    for k, series in enumerate(zip(*log.head_accuracy, strict=True)):
        agreement_axis.plot(series, label=f"head {k + 1} (token t+{k + 2})")
    agreement_axis.set_xlabel("step")
    agreement_axis.set_ylabel("top-1 agreement with the target")
    agreement_axis.legend(fontsize=7)
    fig.suptitle("Medusa heads, self-distillation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
