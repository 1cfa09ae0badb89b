"""The `ember` command: thin subcommands over the library."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# Subcommands that must start without loading torch (the gateway is a separate, engine-free
# process): run straight from their own module, before the other subcommands are imported.
ENGINE_FREE_COMMANDS = {"gateway": "ember.gateway.cli"}


def build_parser() -> argparse.ArgumentParser:
    from ember.cli import (
        eagle_cmd,
        eval_cmd,
        generate_cmd,
        kv_cmd,
        medusa_cmd,
        pull_cmd,
        quantize_cmd,
    )

    parser = argparse.ArgumentParser(prog="ember", description="LLM inference and serving.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    pull_cmd.register(subparsers)
    generate_cmd.register(subparsers)
    eval_cmd.register(subparsers)
    kv_cmd.register(subparsers)
    quantize_cmd.register(subparsers)
    medusa_cmd.register(subparsers)
    eagle_cmd.register(subparsers)
    _register_optional(subparsers)
    return parser


def _register_optional(subparsers: argparse._SubParsersAction) -> None:
    """Subcommands owned by other packages, each a module with `register(subparsers)`."""
    for module_name in ("ember.server.cli", "ember.tokenizers.cli", "ember.bench.cli", *ENGINE_FREE_COMMANDS.values()):
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name).register(subparsers)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ENGINE_FREE_COMMANDS:
        return int(importlib.import_module(ENGINE_FREE_COMMANDS[argv[0]]).main(argv[1:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as error:
        print(f"ember {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
