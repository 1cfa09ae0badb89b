"""`python -m ember.server serve ...`: the same `serve` subcommand as `ember serve`."""

from __future__ import annotations

import argparse
import sys

from ember.server.cli import register


def main(argv: list[str] | None = None) -> int:
    """Parse `serve ...` and run it."""
    parser = argparse.ArgumentParser(prog="python -m ember.server")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
