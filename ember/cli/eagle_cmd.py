"""`ember eagle train`: an EAGLE-style draft head for a model, trained on text files by self-distillation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eagle", help="EAGLE-style draft head for speculative decoding")
    commands = parser.add_subparsers(dest="eagle_command", required=True)
    train = commands.add_parser("train", help="train an EAGLE-style head on a frozen model (self-distillation) and save it")
    train.add_argument("--model", required=True, help="registered name, GGUF file, HF folder or llama2.c .bin")
    train.add_argument("--corpus", type=Path, nargs="+", required=True, help="plain-text files to train on")
    train.add_argument("--steps", type=int, default=200, help="optimizer steps")
    train.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    train.add_argument("--batch-size", type=int, default=4, help="token windows per step")
    train.add_argument("--sequence-length", type=int, default=128, help="tokens per window")
    train.add_argument("--positions-per-window", type=int, default=16,
                       help="positions per window whose logits are distilled (the LM head products are the cost)")
    train.add_argument("--steps-per-batch", type=int, default=1,
                       help="optimizer steps on each batch's hidden states (saves target forwards)")
    train.add_argument("--unroll", type=int, default=2, help="draft steps trained on the head's own predictions")
    train.add_argument("--num-blocks", type=int, default=2, help="residual blocks after the fusion layer")
    train.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head may draft (the corpus's most frequent)")
    train.add_argument("--self-generate", type=int, default=0, metavar="N",
                       help="train on N of the model's own replies to prompts made from the corpus (0: the corpus text)")
    train.add_argument("--reply-tokens", type=int, default=128, help="longest self-generated reply")
    train.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="dtype of the frozen model")
    train.add_argument("--tokenizer", default=None, help="tokenizer file when the model carries none")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", type=Path, required=True, help="folder for eagle.safetensors and eagle_config.json")
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from ember.engine.spec.eagle_training import EagleTrainingConfig, train_eagle_head

    config = EagleTrainingConfig(steps=args.steps, learning_rate=args.lr, batch_size=args.batch_size,
                                 sequence_length=args.sequence_length, positions_per_window=args.positions_per_window,
                                 steps_per_batch=args.steps_per_batch, unroll=args.unroll, num_blocks=args.num_blocks,
                                 draft_vocab_size=args.draft_vocab, self_generated=args.self_generate,
                                 reply_tokens=args.reply_tokens, seed=args.seed)
    result = train_eagle_head(args.model, args.corpus, args.out, config, args.dtype, args.tokenizer, show_progress=sys.stderr.isatty())
    final = result.log.step_accuracy[-1]
    agreement = ", ".join(f"draft step {u + 1} {a:.0%}" for u, a in enumerate(final))
    print(f"wrote {result.out} ({result.num_corpus_tokens} corpus tokens); "
          f"last step: loss {result.log.losses[-1]:.3f}, top-1 agreement with the model: {agreement}")
    return 0
