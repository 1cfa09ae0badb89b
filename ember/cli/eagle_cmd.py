"""`ember eagle train`: an EAGLE-style draft head for a model, trained on text files by self-distillation."""

from __future__ import annotations

import argparse
import sys

from ember.cli.draft_head_args import add_training_arguments, training_fields


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eagle", help="EAGLE-style draft head for speculative decoding")
    commands = parser.add_subparsers(dest="eagle_command", required=True)
    train = commands.add_parser("train", help="train an EAGLE-style head on a frozen model (self-distillation) and save it")
    add_training_arguments(train, "folder for eagle.safetensors and eagle_config.json")
    train.add_argument("--unroll", type=int, default=2, help="draft steps trained on the head's own predictions")
    train.add_argument("--num-blocks", type=int, default=2, help="residual blocks after the fusion layer")
    train.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head may draft (the corpus's most frequent)")
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from ember.training.eagle import EagleTrainingConfig, train_eagle_head

    config = EagleTrainingConfig(unroll=args.unroll, num_blocks=args.num_blocks, draft_vocab_size=args.draft_vocab,
                                 **training_fields(args))
    result = train_eagle_head(args.model, args.corpus, args.out, config, args.dtype, args.tokenizer, show_progress=sys.stderr.isatty())
    final = result.log.step_accuracy[-1]
    agreement = ", ".join(f"draft step {u + 1} {a:.0%}" for u, a in enumerate(final))
    print(f"wrote {result.out} ({result.num_corpus_tokens} training tokens); "
          f"last step: loss {result.log.losses[-1]:.3f}, top-1 agreement with the model: {agreement}")
    return 0
