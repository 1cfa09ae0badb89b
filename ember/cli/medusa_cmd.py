"""`ember medusa train`: Medusa heads for a model, trained on text files by self-distillation."""

from __future__ import annotations

import argparse
import sys

from ember.cli.draft_head_args import add_training_arguments, training_fields


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("medusa", help="Medusa heads for speculative decoding")
    commands = parser.add_subparsers(dest="medusa_command", required=True)
    train = commands.add_parser("train", help="train Medusa heads on a frozen model (self-distillation) and save them")
    add_training_arguments(train, "folder for heads.safetensors and medusa_config.json")
    train.add_argument("--num-heads", type=int, default=4, help="heads = most tokens drafted per step")
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from ember.training.medusa import MedusaTrainingConfig, train_medusa_heads

    config = MedusaTrainingConfig(num_heads=args.num_heads, **training_fields(args))
    result = train_medusa_heads(args.model, args.corpus, args.out, config, args.dtype, args.tokenizer, show_progress=sys.stderr.isatty())
    final = result.log.head_accuracy[-1]
    agreement = ", ".join(f"head {k + 1} {a:.0%}" for k, a in enumerate(final))
    print(f"wrote {result.out} ({config.num_heads} heads, {result.num_corpus_tokens} training tokens); "
          f"last step: loss {result.log.losses[-1]:.3f}, top-1 agreement with the model: {agreement}")
    return 0
