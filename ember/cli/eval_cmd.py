"""`ember eval perplexity`: how well a model predicts a text file, in one window."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.engine.config import EngineConfig, add_engine_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a model")
    tasks = parser.add_subparsers(dest="task", required=True)
    ppl = tasks.add_parser("perplexity", help="perplexity of the first --max-tokens tokens of a text file")
    add_engine_arguments(ppl)
    ppl.add_argument("--file", required=True, type=Path)
    ppl.add_argument("--max-tokens", type=int, default=1024)
    ppl.set_defaults(func=run_perplexity)


def run_perplexity(args: argparse.Namespace) -> int:
    from ember.engine.llm_engine import LLMEngine
    from ember.eval.perplexity import perplexity

    if not args.file.is_file():
        raise FileNotFoundError(f"{args.file} is not a file")
    engine = LLMEngine(EngineConfig.from_args(args))
    result = perplexity(engine, args.file.read_text(encoding="utf-8"), args.max_tokens)
    print(f"perplexity: {result.perplexity:.2f} ({result.num_tokens} tokens)")
    return 0
