"""The `ember serve` subcommand: engine flags plus the server's own."""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

from ember.engine.data_parallel_config import DataParallelConfig, parse_cpus
from ember.engine.device import device_from_args
from ember.engine.sampling_defaults import AUTO, sampling_defaults
from ember.server.config import (
    DEFAULT_MAX_BODY_BYTES,
    TOOL_CALL_FORMATS,
    UVICORN_LOG_LEVELS,
    ServerConfig,
)
from ember.server.openai.reasoning import REASONING_PARSERS

logger = logging.getLogger(__name__)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP server's flags."""
    defaults = ServerConfig()
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=defaults.host, help="address to listen on (default %(default)s)")
    group.add_argument("--port", type=int, default=defaults.port, help="port to listen on (default %(default)s)")
    group.add_argument(
        "--max-waiting",
        type=int,
        default=defaults.max_waiting,
        help="requests allowed to wait to be scheduled (the engine's queue plus requests being tokenized); "
        "beyond it: 503 + Retry-After (default %(default)s)",
    )
    group.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body accepted; beyond it: 413 (default %(default)s)",
    )
    group.add_argument(
        "--served-model-name",
        dest="served_model_names",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model id(s) clients send as 'model' (default: the model's registered name)",
    )
    group.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                       help="LoRA adapters clients pick by 'model' (with --enable-lora); also vLLM's JSON form "
                            '\'{"name": "sql", "path": "/adapters/sql"}\'')
    group.add_argument("--allow-runtime-lora-updating", action="store_true",
                       default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                       help="POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with --enable-lora; default: "
                            "VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM)")
    group.add_argument("--chat-template", type=Path, default=None, help="Jinja file overriding the model's chat template")
    group.add_argument("--trust-request-chat-template", action="store_true",
                       help="let chat requests bring their own Jinja template ('chat_template'); off: refused with 400")
    group.add_argument("--api-key", dest="api_keys", nargs="+", default=None, metavar="KEY",
                       help="requests to /v1 must send 'Authorization: Bearer KEY' (one of these); else 401, as vLLM's")
    group.add_argument("--generation-config", default=AUTO, metavar="auto|vllm|FOLDER",
                       help="sampling defaults for fields a request leaves out: auto (the model folder's "
                            "generation_config.json, as vLLM's default), vllm (OpenAI's), or a folder holding one")
    group.add_argument("--responses-store", default=defaults.responses_store, metavar="PATH",
                       help="SQLite file keeping finished Responses API responses for previous_response_id "
                            "(default %(default)s: kept while the server runs)")
    group.add_argument("--max-stored-responses", type=int, default=defaults.max_stored_responses, metavar="N",
                       help="responses kept at most, the oldest dropped first; 0 keeps none (default %(default)s)")
    group.add_argument("--log-prompts", action="store_true", help="include prompt text in the per-request log lines")
    group.add_argument("--no-debug-endpoints", action="store_true", help="do not expose GET /debug/engine")
    group.add_argument(
        "--header-timeout-s",
        type=float,
        default=defaults.header_timeout_s,
        help="seconds a connection has to send a request's headers; then it is closed (default %(default)s)",
    )
    group.add_argument(
        "--body-timeout-s",
        type=float,
        default=defaults.body_timeout_s,
        help="seconds a request has to send its whole body after its headers; then 408 (default %(default)s)",
    )
    group.add_argument("--data-parallel-size", "-dp", type=int, default=defaults.data_parallel.size, metavar="D",
                       help="engine processes (replicas, each with the whole model and its own tensor / pipeline ranks) "
                            "behind this one API; requests go by prompt prefix and load (default %(default)s)")
    group.add_argument("--data-parallel-cpus", default=None, metavar="all|CORES",
                       help="keep the replicas to these cores ('all', or like 0,1 or 0-3), each on its own contiguous "
                            "share with one thread per core in it (default: not pinned)")
    group.add_argument("--data-parallel-max-restarts", type=int, default=defaults.data_parallel.max_restarts, metavar="N",
                       help="times a replica whose process died is restarted before it is taken out (default %(default)s)")
    group.add_argument(
        "--drain-timeout-s",
        type=float,
        default=defaults.drain_timeout_s,
        help="on SIGTERM, seconds running requests get to finish while new ones get 503; then open streams "
        "end with an error event and [DONE] (default %(default)s)",
    )


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM flags a `vllm serve` command line carries that mean nothing or little on a CPU engine: accepted, so the
    line runs, and each one that changes nothing says so at start (`vllm_notes`)."""
    group = parser.add_argument_group("vLLM compatibility")
    group.add_argument("--swap-space", type=float, default=None, help="nothing is swapped: preempted sequences are recomputed")
    group.add_argument("--disable-log-stats", action="store_true", help="accepted: ember logs no periodic stats (see /metrics)")
    group.add_argument("--disable-log-requests", action="store_true", help="no log line per finished request")
    group.add_argument("--uvicorn-log-level", default="info", choices=UVICORN_LOG_LEVELS, help="the HTTP server's log level")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="accepted: tool_choice 'auto' is always on when a request brings tools")
    group.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                       help="a thinking model's text up to </think> goes to the reply's reasoning_content, the rest to content")
    group.add_argument("--tool-call-parser", default=None, choices=TOOL_CALL_FORMATS,
                       help="accepted: ember reads calls in every one of these formats, whichever the model writes")


def vllm_notes(args: argparse.Namespace) -> list[str]:
    """What each accepted vLLM flag that changes nothing here means, to log at start."""
    notes = []
    if args.gpu_memory_utilization is not None and device_from_args(args).resolved().type == "cpu":
        notes.append("--gpu-memory-utilization has no effect on a CPU engine; size the KV cache with --kv-cache-memory "
                     "or --num-kv-blocks")
    if args.swap_space is not None:
        notes.append("--swap-space has no effect: ember recomputes preempted sequences instead of swapping their KV cache")
    return notes


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe."""
    chat_template = None
    if args.chat_template is not None:
        if not args.chat_template.is_file():
            raise SystemExit(f"--chat-template {args.chat_template}: no such file")
        chat_template = args.chat_template.read_text(encoding="utf-8")
    try:
        return ServerConfig(
            host=args.host,
            port=args.port,
            max_waiting=args.max_waiting,
            max_body_bytes=args.max_body_bytes,
            served_model_names=args.served_model_names or [],
            log_prompts=args.log_prompts,
            log_requests=not args.disable_log_requests,
            uvicorn_log_level=args.uvicorn_log_level,
            reasoning_parser=args.reasoning_parser,
            chat_template=chat_template,
            trust_request_chat_template=args.trust_request_chat_template,
            enable_debug_endpoints=not args.no_debug_endpoints,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
            drain_timeout_s=args.drain_timeout_s,
            api_keys=tuple(args.api_keys or ()),
            responses_store=args.responses_store,
            max_stored_responses=args.max_stored_responses,
            lora_modules=lora_modules_from_args(args),
            allow_runtime_lora_updating=args.allow_runtime_lora_updating,
            data_parallel=DataParallelConfig(
                args.data_parallel_size,
                None if args.data_parallel_cpus is None else parse_cpus(args.data_parallel_cpus),
                args.data_parallel_max_restarts,
            ),
        )
    except ValueError as error:
        raise SystemExit(f"ember serve: {error}") from None


def lora_modules_from_args(args: argparse.Namespace) -> dict[str, str]:
    """--lora-modules as {name: folder}: each NAME=PATH or vLLM's JSON form {"name": ..., "path": ...}; every adapter's
    config is read now (DoRA, a rank above --max-lora-rank refused by name), so a bad adapter stops the server here."""
    from ember.models.lora_adapter import read_adapter_config

    modules = {}
    for spec in args.lora_modules or ():
        if spec.lstrip().startswith("{"):
            entry = json.loads(spec)
            name, path = entry.get("name"), entry.get("path")
        else:
            name, _, path = spec.partition("=")
        if not name or not path:
            raise ValueError(f"--lora-modules {spec!r}: give NAME=PATH or {{\"name\": ..., \"path\": ...}}")
        if not args.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        rank = int(read_adapter_config(Path(path))["r"])
        if rank > args.max_lora_rank:
            raise ValueError(f"--lora-modules {name}: adapter rank {rank} is above --max-lora-rank {args.max_lora_rank}; "
                             f"raise --max-lora-rank to at least {rank}")
        modules[name] = path
    return modules


def with_generation_config(config: ServerConfig, setting: str, model: str) -> ServerConfig:
    """`config` with the sampling defaults `--generation-config` gives for `model`."""
    try:
        return replace(config, sampling_defaults=sampling_defaults(setting, model))
    except ValueError as error:
        raise SystemExit(f"ember serve: {error}") from None


def serve_command(args: argparse.Namespace) -> int:
    """Run `ember serve` with parsed flags; returns the exit status."""
    from ember.engine.config import EngineConfig
    from ember.server.serve import run_server

    server_config = server_config_from_args(args)
    try:
        engine_config = EngineConfig.from_args(args)
    except ValueError as error:
        raise SystemExit(f"ember serve: {error}") from None
    if server_config.data_parallel.is_replicated and engine_config.parallel.nnodes > 1:
        raise SystemExit("ember serve: --data-parallel-size with --nnodes is not built yet: every replica runs on this "
                         "machine; drop --nnodes, or run one server per machine behind the gateway")
    if engine_config.parallel.node_rank > 0:  # a worker node of a multi-node group: no engine, no server
        from ember.models.registry import resolve_model
        from ember.parallel.driver import run_worker_node

        return run_worker_node(resolve_model(engine_config.model), engine_config.dtype, engine_config.parallel,
                               engine_config.max_model_len, engine_config.quant_activations)
    if server_config.served_model_names:
        engine_config.served_model_name = server_config.served_model_names[0]
    server_config = with_generation_config(server_config, args.generation_config, engine_config.model)
    for note in vllm_notes(args):
        logger.warning(note)
    run_server(engine_config, server_config)
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `serve` to the `ember` command; the parser's `func` runs it."""
    from ember.engine.config import add_engine_arguments

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Load a model and serve /v1/chat/completions, /v1/completions, /metrics and more.",
    )
    add_engine_arguments(parser, model_positional=True)
    add_server_arguments(parser)
    add_vllm_arguments(parser)
    parser.set_defaults(func=serve_command)
    return parser
