"""What training a draft head on a frozen target needs, whatever the head: corpus tokens, the target's
final hidden states over token windows, and its LM head as a differentiable product.

Medusa heads (ember.training.medusa) and the EAGLE-style head (ember.training.eagle) both learn the target's
own outputs (self-distillation), so both read the target the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ember.engine.engine_request import EngineRequest
from ember.engine.request import Request, Sequence
from ember.engine.runner import ModelRunner
from ember.engine.sampling_params import SamplingParams
from ember.engine.scheduler import ScheduledSequence, SchedulerOutput
from ember.engine.spec.lm_head_rows import lm_head_rows
from ember.kv.cache_manager import KVCacheManager
from ember.kv.tensors import kv_cache_layout
from ember.layers.sampler import Sampler
from ember.llm import LLM
from ember.models.loader import LoadedModel
from ember.tokenizers.base import Tokenizer

T = TypeVar("T")
CHARS_PER_TOKEN_BOUND = 8  # corpus text read per token needed: English BPE averages about 4 characters a token
BLOCK_SIZE = 16


def check_corpus(paths: list[Path]) -> None:
    """Raise, naming the fix, unless `paths` are existing files."""
    if not paths:
        raise ValueError("give at least one corpus file (--corpus FILE)")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist; give text files to train on (--corpus FILE)")


def corpus_tokens(paths: list[Path], tokenizer: Tokenizer, num_tokens: int) -> list[int]:
    """About `num_tokens` tokens from the corpus files (a share of each), concatenated; raises when they hold too few."""
    check_corpus(paths)
    chars_each = math.ceil(num_tokens * CHARS_PER_TOKEN_BOUND / len(paths))
    tokens: list[int] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            tokens.extend(tokenizer.encode(f.read(chars_each), add_special_tokens=False))
    return tokens


def differentiable_lm_head(target: torch.nn.Module) -> torch.Tensor:
    """The LM head as a dense float32 matrix [vocab, hidden] giving the target's own logits (`lm_head_rows`).

    The loaded head runs through a compiled kernel without autograd; a head's gradient goes
    through this dense copy instead, in the dtype of the hidden states it multiplies.
    """
    return lm_head_rows(target).to(next(target.parameters()).dtype)


class TargetForward:
    """Full-window prefills of a frozen target for a fixed batch shape; gives its final hidden states."""

    def __init__(self, target: torch.nn.Module, batch_size: int, sequence_length: int) -> None:
        # A prefill writes every position of every layer group (a sliding-window group too: one pool, a table each).
        group_windows = kv_cache_layout(target).group_windows
        num_blocks = batch_size * -(-sequence_length // BLOCK_SIZE) * len(group_windows)
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=False, group_windows=group_windows)
        self.runner = ModelRunner(target, num_blocks, BLOCK_SIZE, self.kv, Sampler(torch.Generator()), frozenset())

    def hidden(self, windows: list[list[int]]) -> torch.Tensor:
        """The target's final hidden states over each window, as a fresh prefill: [B, L, H]."""
        scheduled = []
        for i, window in enumerate(windows):
            seq_id = f"distill-{i}"
            seq = Sequence(seq_id, Request(EngineRequest(seq_id, window, SamplingParams(max_tokens=1))), 0, list(window), len(window))
            if self.kv.allocate_slots(seq_id, window, 0, len(window)) is None:
                raise RuntimeError("the training KV cache is sized for one batch of windows and must have room")
            scheduled.append(ScheduledSequence(seq, len(window), self.kv.block_ids(seq_id)))
        try:
            hidden = self.runner.hidden_states(SchedulerOutput(scheduled))
        finally:
            for item in scheduled:
                self.kv.free(item.seq.seq_id)
        return hidden.clone().reshape(len(windows), len(windows[0]), -1)  # a normal tensor, usable by autograd


def load_training_target(model: str, corpus: list[Path], dtype: str, tokenizer: str | None, show_progress: bool):
    """The frozen target (a `LoadedModel`) and the tokenizer to read the corpus with; raises naming the fix."""
    from ember.engine.builder import load_tokenizer_from
    from ember.models.loader import load_model
    from ember.models.registry import resolve_model

    check_corpus(corpus)
    loaded = load_model(resolve_model(model), dtype, show_progress=show_progress)
    text_tokenizer = load_tokenizer_from(Path(tokenizer) if tokenizer else loaded.tokenizer_path)
    if text_tokenizer is None:
        raise ValueError(f"{model} carries no tokenizer to read the corpus with; pass --tokenizer FILE")
    return loaded, text_tokenizer


def train_with_progress(label: str, steps: int, train: Callable[[Callable[[int, float], None]], T], show_progress: bool) -> T:
    """Run `train(on_step)` under a progress bar of `steps` steps showing the newest loss."""
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
               TimeRemainingColumn())
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task("train", total=steps, loss="-")
        return train(lambda step, loss: progress.update(task, completed=step + 1, loss=f"{loss:.3f}"))


def plot_training(losses: list[float], agreement: dict[str, list[float]], title: str, path: Path) -> Path:
    """Loss per step beside each named series of top-1 agreement with the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_axis, agreement_axis) = plt.subplots(1, 2, figsize=(9, 3.4))
    loss_axis.plot(losses)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss")
    for label, series in agreement.items():
        agreement_axis.plot(series, label=label)
    agreement_axis.set_xlabel("step")
    agreement_axis.set_ylabel("top-1 agreement with the target")
    agreement_axis.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


SELF_GENERATION_TASKS = ("Continue this text:", "Summarize this passage:", "Rewrite this in plain modern English:",
                         "What happens in this passage?")
SNIPPET_CHARS = 300  # corpus text in each generation prompt
PROMPT_TAIL_TOKENS = 16  # prompt tokens kept before each reply: the reply's first tokens have a context to draft from


def self_generated_tokens(
    loaded: LoadedModel, model: str, dtype: str, tokenizer: Tokenizer, corpus: list[Path], num_replies: int,
    reply_tokens: int, seed: int, show_progress: bool = False,
) -> list[int]:
    """The target's own replies (sampled at temperature 0.7), each after the last tokens of its prompt, concatenated.

    A draft head drafts for what the target writes, so it learns best from that rather than from the
    corpus's prose (Medusa-2 and EAGLE train on regenerated replies too). Prompts are corpus snippets
    under a task ("Continue this text:", ...), rendered with the chat template when the model has one,
    else the snippet alone. `loaded` is `model`'s weights at `dtype`, already in memory (not loaded twice).
    """
    import random

    from ember.tokenizers.chat_template import load_chat_template

    check_corpus(corpus)
    text = "".join(path.read_text(encoding="utf-8", errors="replace") for path in corpus)
    if len(text) < 2 * SNIPPET_CHARS:
        raise ValueError(f"the corpus holds {len(text)} characters; self-generation prompts need at least {2 * SNIPPET_CHARS}")
    chooser = random.Random(seed)
    snippets = [(chooser.choice(SELF_GENERATION_TASKS), text[s : s + SNIPPET_CHARS])
                for s in (chooser.randrange(len(text) - SNIPPET_CHARS) for _ in range(num_replies))]
    template = load_chat_template(tokenizer, None)
    if template is None:
        prompts = [tokenizer.encode(snippet, add_special_tokens=True) for _, snippet in snippets]
    else:
        prompts = [tokenizer.encode(template.render([{"role": "user", "content": f"{task}\n\n{snippet}"}], True),
                                    add_special_tokens=False) for task, snippet in snippets]
    llm = LLM(model, dtype=dtype, seed=seed, loaded=loaded, max_num_seqs=32)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.7, max_tokens=reply_tokens, seed=seed), show_progress)
    tokens: list[int] = []
    for output in outputs:
        tokens.extend(output.prompt_token_ids[-PROMPT_TAIL_TOKENS:] + output.outputs[0].token_ids)
    return tokens


class TextSettings(Protocol):
    """What a training config says about its text (MedusaTrainingConfig and EagleTrainingConfig both do)."""

    steps: int
    steps_per_batch: int
    batch_size: int
    sequence_length: int
    self_generated: int
    reply_tokens: int
    seed: int


def training_tokens(
    loaded: LoadedModel, model: str, dtype: str, tokenizer: Tokenizer, corpus: list[Path], settings: TextSettings,
    show_progress: bool = False,
) -> list[int]:
    """What a head trains on: `settings.self_generated` replies of the target (`self_generated_tokens`), or (0) as
    many corpus tokens as the optimizer steps' windows read."""
    if settings.self_generated:
        return self_generated_tokens(loaded, model, dtype, tokenizer, corpus, settings.self_generated,
                                     settings.reply_tokens, settings.seed, show_progress)
    num_batches = -(-settings.steps // settings.steps_per_batch)
    return corpus_tokens(corpus, tokenizer, num_batches * settings.batch_size * settings.sequence_length)


def load_training_text(
    model: str, corpus: list[Path], dtype: str, tokenizer: str | None, settings: TextSettings, show_progress: bool
) -> tuple[torch.nn.Module, list[int]]:
    """The frozen target and the tokens to train a head for it on (`training_tokens`)."""
    loaded, text_tokenizer = load_training_target(model, corpus, dtype, tokenizer, show_progress)
    return loaded.model, training_tokens(loaded, model, dtype, text_tokenizer, corpus, settings, show_progress)
