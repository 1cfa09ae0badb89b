"""`ember gateway --config gateway.yaml --port P`: run the gateway (no engine, no torch)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ember.gateway.config import ConfigError, hash_key, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="gateway YAML file (see docs/gateway.md)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=4000, help="port to listen on (default %(default)s)")
    parser.add_argument("--hash-key", metavar="KEY", default=None, help="print the SHA-256 to put in the config for a virtual key, and exit")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("gateway", help="OpenAI-compatible gateway in front of many model servers")
    add_arguments(parser)
    parser.set_defaults(func=gateway_command)
    return parser


def gateway_command(args: argparse.Namespace) -> int:
    if args.hash_key is not None:
        print(hash_key(args.hash_key))
        return 0
    if args.config is None:
        raise SystemExit("ember gateway: --config gateway.yaml is required (or --hash-key KEY)")
    try:
        config = load_config(args.config)
    except ConfigError as error:
        raise SystemExit(f"ember gateway: {error}") from None
    import uvicorn

    from ember.gateway.app import build_app

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stderr)
    uvicorn.run(build_app(config), host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember gateway", description="OpenAI-compatible gateway in front of many model servers.")
    add_arguments(parser)
    return gateway_command(parser.parse_args(argv))
