"""`ember pull NAME`: fetch a registered model into the cache folder."""

from __future__ import annotations

import argparse

from ember.models.registry import REGISTERED_MODELS, pull


def register(subparsers: argparse._SubParsersAction) -> None:
    listing = "\n".join(f"  {name}: {model.description}" for name, model in sorted(REGISTERED_MODELS.items()))
    parser = subparsers.add_parser(
        "pull",
        help="download a registered model and check its sha256",
        epilog=f"registered models:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=sorted(REGISTERED_MODELS), help="registered model name")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pull(args.name)
    return 0
