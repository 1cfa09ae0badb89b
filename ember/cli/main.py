"""The `ember` command: thin subcommands over the library.

Each subcommand lives in a module with `register(subparsers)`, which builds its parser from
flag tables alone; the library it drives (torch, the engine, the server) is imported inside the
command function. `ember CMD ...` imports only CMD's module, so `ember --help`, `ember CMD --help`
and the engine-free `ember gateway` start without loading torch (tests/cli/test_help.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand -> the module that registers it (`tokenizers.cli` registers `tokenize` and `tokenizers`).
COMMAND_MODULES = {
    "pull": "ember.cli.pull_cmd",
    "generate": "ember.cli.generate_cmd",
    "serve": "ember.server.cli",
    "eval": "ember.cli.eval_cmd",
    "kv": "ember.cli.kv_cmd",
    "quantize": "ember.cli.quantize_cmd",
    "medusa": "ember.cli.medusa_cmd",
    "eagle": "ember.cli.eagle_cmd",
    "tokenize": "ember.tokenizers.cli",
    "tokenizers": "ember.tokenizers.cli",
    "bench": "ember.bench.cli",
    "gateway": "ember.gateway.cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `ember` parser with every subcommand, or with `command`'s alone (so only its module is imported)."""
    parser = argparse.ArgumentParser(prog="ember", description="LLM inference and serving.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else COMMAND_MODULES.values()
    for module_name in dict.fromkeys(modules):
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as error:
        print(f"ember {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
