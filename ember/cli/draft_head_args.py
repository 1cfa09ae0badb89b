"""The flags `ember medusa train` and `ember eagle train` share: the model, its training text and the batch shape."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_training_arguments(train: argparse.ArgumentParser, out_help: str) -> None:
    """Model, corpus, optimizer steps and batch shape, self-generation, dtype, tokenizer, seed and --out."""
    train.add_argument("--model", required=True, help="registered name, GGUF file, HF folder or llama2.c .bin")
    train.add_argument("--corpus", type=Path, nargs="+", required=True, help="plain-text files to train on")
    train.add_argument("--steps", type=int, default=200, help="optimizer steps")
    train.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    train.add_argument("--batch-size", type=int, default=4, help="token windows per step")
    train.add_argument("--sequence-length", type=int, default=128, help="tokens per window")
    train.add_argument("--positions-per-window", type=int, default=16,
                       help="positions per window whose logits are distilled (the LM head products are the cost)")
    train.add_argument("--steps-per-batch", type=int, default=1,
                       help="optimizer steps on each batch's hidden states (saves target forwards; new positions each step)")
    train.add_argument("--self-generate", type=int, default=0, metavar="N",
                       help="train on N of the model's own replies to prompts made from the corpus (0: the corpus text)")
    train.add_argument("--reply-tokens", type=int, default=128, help="longest self-generated reply")
    train.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="dtype of the frozen model")
    train.add_argument("--tokenizer", default=None, help="tokenizer file when the model carries none")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", type=Path, required=True, help=out_help)


def training_fields(args: argparse.Namespace) -> dict:
    """The training-config fields those flags set (MedusaTrainingConfig and EagleTrainingConfig share them)."""
    return {"steps": args.steps, "learning_rate": args.lr, "batch_size": args.batch_size,
            "sequence_length": args.sequence_length, "positions_per_window": args.positions_per_window,
            "steps_per_batch": args.steps_per_batch, "self_generated": args.self_generate,
            "reply_tokens": args.reply_tokens, "seed": args.seed}
