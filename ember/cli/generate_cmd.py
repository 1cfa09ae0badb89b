"""`ember generate`: one prompt (or chat message) in, streamed text out."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ember.engine.config import EngineConfig, add_engine_arguments

if TYPE_CHECKING:  # the engine (and torch) load when the command runs, not to build its parser
    from ember.engine.llm_engine import LLMEngine
    from ember.engine.structured import StructuredOutput


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate text for one prompt")
    add_engine_arguments(parser)
    parser.add_argument("--prompt", required=True, help='prompt text ("" = start from BOS)')
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    parser.add_argument("--system", default=None, help="system message (with --chat)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--sample-seed", type=int, default=None, dest="sample_seed", help="per-request sampling seed")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json-object", action="store_true", help="hold the output to one JSON object")
    shape.add_argument("--json-schema", type=Path, default=None, metavar="FILE", help="hold the output to a value of this JSON schema")
    shape.add_argument("--choice", action="append", default=None, help="hold the output to one of these strings (repeatable)")
    shape.add_argument("--regex", default=None, help="hold the output to text this regular expression matches whole")
    shape.add_argument("--grammar", type=Path, default=None, metavar="FILE",
                       help="hold the output to text this grammar derives: GBNF / EBNF (root ::= ...) or Lark (start: ...)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ember.engine.engine_request import EngineRequest
    from ember.engine.llm_engine import LLMEngine
    from ember.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig.from_args(args), show_progress=sys.stderr.isatty())
    prompt_ids = prompt_token_ids(engine, args.prompt, args.chat, args.system)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.sample_seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        structured_output=structured_output(args),
    )
    engine.add_request(EngineRequest("cli", prompt_ids, params, prompt=args.prompt))
    while engine.has_unfinished_requests():
        for output in engine.step():
            for completion in output.outputs:
                sys.stdout.write(completion.text)
                sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def structured_output(args: argparse.Namespace) -> StructuredOutput | None:
    """The output constraint the flags ask for (None: free text)."""
    from ember.engine.structured import StructuredOutput

    if args.json_object:
        return StructuredOutput(json_object=True)
    if args.choice:
        return StructuredOutput(choice=tuple(args.choice))
    if args.regex is not None:
        return StructuredOutput(regex=args.regex)
    if args.grammar is not None:
        try:
            return StructuredOutput(grammar=args.grammar.read_text(encoding="utf-8"))
        except OSError as error:
            raise ValueError(f"--grammar {args.grammar}: cannot read it ({error})") from error
    if args.json_schema is None:
        return None
    try:
        schema = json.loads(args.json_schema.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--json-schema {args.json_schema}: cannot read a JSON schema from it ({error})") from error
    return StructuredOutput(json_schema=schema)


def prompt_token_ids(engine: LLMEngine, prompt: str, chat: bool, system: str | None) -> list[int]:
    """The prompt's token ids; "" means just BOS; `chat` renders it with the model's template."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError("this model carries no tokenizer; pass --tokenizer PATH")
    if chat:
        from ember.tokenizers.chat_template import load_chat_template

        template = load_chat_template(tokenizer)
        if template is None:
            raise ValueError("this model has no chat template; drop --chat")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return tokenizer.encode(template.render(messages, add_generation_prompt=True), add_special_tokens=False)
    if prompt == "":
        if tokenizer.bos_id is None:
            raise ValueError("an empty prompt needs a BOS token, and this tokenizer has none")
        return [tokenizer.bos_id]
    return tokenizer.encode(prompt, add_special_tokens=True)
