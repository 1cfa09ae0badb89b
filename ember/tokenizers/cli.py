"""`ember tokenize` and `ember tokenizers train|compare`: thin commands over ember.tokenizers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ember.tokenizers.text.patterns import NAMED_PATTERNS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `tokenize` and `tokenizers {train,compare}` to the `ember` command."""
    tokenize = subparsers.add_parser("tokenize", help="show the token ids and pieces of a text")
    tokenize.add_argument("--tokenizer", required=True, help="tokenizer file or folder (SPEC)")
    tokenize.add_argument("text", help="the text to tokenize")
    tokenize.add_argument("--add-special-tokens", action="store_true", help="prepend BOS if used")
    tokenize.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tokenize.set_defaults(func=run_tokenize)

    group = subparsers.add_parser("tokenizers", help="train or compare tokenizers")
    commands = group.add_subparsers(dest="tokenizers_command", required=True)

    train = commands.add_parser("train", help="train a BPE or Unigram tokenizer")
    train.add_argument("files", nargs="+", type=Path, help="UTF-8 text files to train on")
    train.add_argument("--kind", choices=("bpe", "unigram"), default="bpe")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument(
        "--output",
        type=Path,
        required=True,
        help="output path without suffix: writes .tiktoken + .json (bpe) or .model",
    )
    train.add_argument(
        "--pattern",
        choices=sorted(NAMED_PATTERNS),
        default="cl100k",
        help="pre-tokenizer pattern (bpe)",
    )
    train.add_argument("--special", action="append", default=[], help="special token (bpe)")
    train.set_defaults(func=run_train)

    compare = commands.add_parser(
        "compare", help="tokens per 1,000 characters by language, as a table and a PNG"
    )
    compare.add_argument(
        "--tokenizer",
        action="append",
        required=True,
        metavar="[NAME=]SPEC",
        help="a tokenizer to compare (repeat)",
    )
    compare.add_argument(
        "--text",
        action="append",
        default=[],
        metavar="LANGUAGE=FILE",
        help="a text file per language (repeat); 'english' is the baseline",
    )
    compare.add_argument(
        "--firefox-l10n",
        action="append",
        default=[],
        metavar="LANGUAGE=DEB",
        help="a firefox-esr-l10n-* .deb per language (from `apt-get download`): their shared "
        "messages are used as parallel text (repeat)",
    )
    compare.add_argument("--plot", type=Path, help="write a bar chart PNG here")
    compare.set_defaults(func=run_compare)


def _named(spec: str) -> tuple[str, str]:
    if "=" in spec:
        name, _, value = spec.partition("=")
        return name, value
    return Path(spec).stem if Path(spec).is_file() else Path(spec).name, spec


def run_tokenize(args: argparse.Namespace) -> int:
    from ember.tokenizers.loading import load

    tokenizer = load(args.tokenizer)
    ids = tokenizer.encode(args.text, add_special_tokens=args.add_special_tokens)
    pieces = [tokenizer.token_bytes(token_id) for token_id in ids]
    if args.json:
        print(
            json.dumps(
                {"ids": ids, "pieces": [p.decode("utf-8", "replace") for p in pieces]},
                ensure_ascii=False,
            )
        )
        return 0
    print(f"{len(ids)} tokens: {ids}")
    for token_id, piece in zip(ids, pieces, strict=True):
        print(f"{token_id:>8}  {piece!r}")
    return 0


def run_train(args: argparse.Namespace) -> int:
    missing = [str(path) for path in args.files if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"training files not found: {', '.join(missing)}")
    texts = [path.read_text(encoding="utf-8") for path in args.files]
    if args.kind == "bpe":
        from ember.tokenizers.training.bpe import train_bpe

        result = train_bpe(texts, args.vocab_size, NAMED_PATTERNS[args.pattern], args.special)
        result.write_tiktoken(args.output.with_suffix(".tiktoken"))
        result.write_tokenizer_json(args.output.with_suffix(".json"))
        print(
            f"wrote {args.output.with_suffix('.tiktoken')} and {args.output.with_suffix('.json')} "
            f"({result.vocab_size} tokens)"
        )
    else:
        from ember.tokenizers.training.unigram import train_unigram

        lines = [line for text in texts for line in text.splitlines()]
        model = train_unigram(lines, args.vocab_size)
        model.save(args.output.with_suffix(".model"))
        print(f"wrote {args.output.with_suffix('.model')} ({len(model.pieces)} pieces)")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from ember.tokenizers.compare import format_table, measure_costs, plot_costs
    from ember.tokenizers.loading import load

    tokenizers = {name: load(spec) for name, spec in map(_named, args.tokenizer)}
    texts = {}
    for spec in args.text:
        language, _, path = spec.partition("=")
        if not path:
            raise ValueError(f"--text {spec!r}: write LANGUAGE=FILE, e.g. --text korean=ko.txt")
        texts[language] = Path(path).read_text(encoding="utf-8")
    packs = {}
    for spec in args.firefox_l10n:
        language, _, path = spec.partition("=")
        if not path:
            raise ValueError(
                f"--firefox-l10n {spec!r}: write LANGUAGE=DEB, e.g. "
                "--firefox-l10n korean=firefox-esr-l10n-ko_140.0esr-1_all.deb"
            )
        packs[language] = path
    if packs:
        from ember.tokenizers.deb_text import parallel_texts

        texts.update(parallel_texts(packs))
    if not texts:
        raise ValueError(
            "give text to compare on: --text LANGUAGE=FILE or --firefox-l10n LANGUAGE=DEB"
        )
    cells = measure_costs(tokenizers, texts)
    print(format_table(cells, baseline="english" if "english" in texts else None))
    if args.plot:
        plot_costs(cells, args.plot)
        print(f"wrote {args.plot}")
    return 0
