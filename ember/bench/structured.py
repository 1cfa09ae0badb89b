"""`ember bench structured`: what holding the output to a shape costs, against free text, same run.

Greedy chat prompts that ask for a description of an item, at batch 1 and batch 16 (16 prompts arriving at once).
Variants of one engine, interleaved per repeat: free text; `json_object`; a `json_schema` of the fields the prompt
names, through each backend (ember's own engine, xgrammar, llguidance); a GBNF grammar of the same fields as
"key: value" lines through the two backends that read grammars; at batch 1 also the schema on an engine that has
run the workload once untimed (a server that has served the schema before; its prompts also come from the prefix
cache, so only its decode compares), without and with n-gram speculation. Masks are computed on the engine's mask
thread while the forward pass runs, and tokens a constraint forces are appended without a model step (jump-forward,
counted as output tokens: they are what a user receives).
Each run builds a fresh engine, so the first request of a cold run pays for the backend's vocabulary (ember's byte
trie, xgrammar's tokenizer info, llguidance's token trie) in its TTFT, and ember's engine for the masks of the
recogniser states it meets first in its decode. Each constrained output is checked: finished (it ended before
max_tokens) and, if so, parsed as JSON and validated against the schema, or matched against the grammar's language.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

from ember.bench.ember_runner import EmberSettings, run_ember
from ember.bench.results import RunResult
from ember.bench.spec import decode_tok_s
from ember.bench.spec_workloads import encode_chat
from ember.bench.stats import ratio, spread
from ember.bench.suite import BenchOptions, _interleave, model_path
from ember.bench.workloads import BenchRequest, Workload
from ember.engine.structured import StructuredOutput

ITEMS = ("a red bicycle", "a paperback novel", "a cast-iron pan", "a pair of running shoes", "a desk lamp",
         "a chess set", "a rain jacket", "a coffee grinder", "a wool scarf", "a garden hose")  # fmt: skip
CATEGORIES = ["sports", "books", "kitchen", "clothing", "home", "games"]
ITEM_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "category": {"enum": CATEGORIES},
        "price": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "in_stock": {"type": "boolean"},
    },
    "required": ["name", "category", "price", "tags", "in_stock"],
    "additionalProperties": False,
}
SCHEMA = StructuredOutput(json_schema=ITEM_SCHEMA)
ITEM_GRAMMAR = "\n".join([
    'root ::= "name: " text "\\ncategory: " category "\\nprice: " price "\\ntags: " text (", " text){0,3} "\\nin stock: " ("yes" | "no")',
    "text ::= [a-zA-Z] [a-zA-Z -]{0,23}",
    f"category ::= {' | '.join(json.dumps(c) for c in CATEGORIES)}",
    'price ::= [0-9]{1,4} "." [0-9] [0-9]',
])  # fmt: skip
ITEM_GRAMMAR_TEXT = re.compile(  # the grammar's language, to check the replies
    rf"name: {'(?:[a-zA-Z][a-zA-Z -]{0,23})'}\ncategory: (?:{'|'.join(CATEGORIES)})\nprice: [0-9]{{1,4}}\.[0-9]{{2}}\n"
    rf"tags: [a-zA-Z][a-zA-Z -]{{0,23}}(?:, [a-zA-Z][a-zA-Z -]{{0,23}}){{0,3}}\nin stock: (?:yes|no)")
GRAMMAR = StructuredOutput(grammar=ITEM_GRAMMAR)
BATCH_SIZES = (1, 16)


@dataclass(frozen=True)
class Variant:
    """One engine of the comparison: its constraint (None: free text), backend, untimed passes first (a server that
    has served the workload before), speculation, and whether it also runs at batch sizes above 1."""

    constraint: StructuredOutput | None
    backend: str = "auto"
    untimed_passes: int = 0
    speculative_method: str | None = None
    is_batched: bool = True


VARIANTS = {
    "free text": Variant(None),
    "json_object": Variant(StructuredOutput(json_object=True), is_batched=False),
    "json_schema, ember": Variant(SCHEMA, "ember"),
    "json_schema, xgrammar": Variant(SCHEMA, "xgrammar"),
    "json_schema, llguidance": Variant(SCHEMA, "llguidance"),
    "grammar, xgrammar": Variant(GRAMMAR, "xgrammar"),
    "grammar, llguidance": Variant(GRAMMAR, "llguidance"),
    "json_schema, ember, served before": Variant(SCHEMA, "ember", 1),
    "json_schema, ember, served before, n-gram": Variant(SCHEMA, "ember", 1, "ngram", is_batched=False),
}


def variants_at(batch_size: int) -> dict[str, Variant]:
    """The variants that run at `batch_size` (every one at batch 1)."""
    return {name: variant for name, variant in VARIANTS.items() if batch_size == 1 or variant.is_batched}


def build_structured_workload(tokenizer, seed: int, num_prompts: int, output_len: int) -> Workload:
    """`num_prompts` chat prompts asking for one item with the schema's fields (items repeat past ten, in a new order)."""
    rng = random.Random(seed)
    items = [item for _ in range(-(-num_prompts // len(ITEMS))) for item in rng.sample(ITEMS, len(ITEMS))][:num_prompts]
    fields = ", ".join(ITEM_SCHEMA["properties"])
    requests = [
        BenchRequest(f"structured-{i}", encode_chat(tokenizer, f"Describe {item} as a JSON object with the fields {fields} "
                     f"(category one of {', '.join(CATEGORIES)})."), output_len, role="structured")  # fmt: skip
        for i, item in enumerate(items)
    ]
    params = {"num_requests": len(requests), "output_len": output_len, "prompt_len": [r.prompt_len for r in requests]}
    return Workload("structured", seed, requests, params, "generated")


def bench_structured(options: BenchOptions, num_prompts: int = 3, output_len: int = 128,
                     batch_sizes: tuple[int, ...] = BATCH_SIZES, only: tuple[str, ...] | None = None) -> dict:  # fmt: skip
    """The section: per batch size, each variant's decode rate, TTFT and output checks, and the ratios to free text.
    `only`: the variants to run (free text always runs: the ratios are to it); None: all."""
    unknown = sorted(set(only or ()) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown structured variants {unknown}; choose from {', '.join(VARIANTS)}")
    from ember.tokenizers import load

    tokenizer = load(model_path(options.model))
    dtype = options.dtypes[0]
    batches = {}
    for batch_size in batch_sizes:
        workload = build_structured_workload(tokenizer, options.seed, max(num_prompts, batch_size), output_len)
        variants = {name: variant for name, variant in variants_at(batch_size).items()
                    if only is None or name == "free text" or name in only}  # fmt: skip
        runners: dict[str, Callable[[], RunResult]] = {
            name: lambda settings=EmberSettings(max_num_seqs=batch_size, structured_output=v.constraint,
                                                structured_outputs_backend=v.backend, untimed_passes=v.untimed_passes,
                                                speculative_method=v.speculative_method), workload=workload:
                run_ember(options.model, dtype, workload, settings)
            for name, v in variants.items()
        }  # fmt: skip
        runs = _interleave(options, f"structured, batch {batch_size}", runners)
        entries = {name: _variant(runs[name], tokenizer, variants[name].constraint, output_len) for name in variants}
        plain = entries["free text"]
        for name, entry in entries.items():
            if name != "free text":
                entry["decode_ratio"] = ratio(entry["decode_tok_s"]["median"], plain["decode_tok_s"]["median"])
                entry["first_ttft_extra_s"] = entry["ttft_s"]["median"] - plain["ttft_s"]["median"]
        batches[str(batch_size)] = {"workload": workload.params, "variants": entries}
    return {"dtype": dtype, "repeats": options.repeats, "schema": ITEM_SCHEMA, "grammar": ITEM_GRAMMAR, "batches": batches}


def _variant(runs: list[RunResult], tokenizer, constraint: StructuredOutput | None, output_len: int) -> dict:
    ttfts = [run.requests[0].ttft_s for run in runs]  # the first request's: at batch 1 the others queue behind it
    entry = {"decode_tok_s": spread([decode_tok_s(run) for run in runs]).to_dict(), "ttft_s": spread(ttfts).to_dict(),
             "output_tokens": median(t.output_tokens for run in runs for t in run.requests)}  # fmt: skip
    if constraint is not None:
        outputs = [tokenizer.decode(t.output_token_ids, skip_special_tokens=True) for t in runs[-1].requests]
        finished = [text for text, t in zip(outputs, runs[-1].requests, strict=True) if t.output_tokens < output_len]
        entry["finished"] = [len(finished), len(outputs)]
        entry["valid"] = sum(_conforms(text, constraint) for text in finished)
    return entry


def _conforms(text: str, constraint: StructuredOutput) -> bool:
    """Whether `text` is in the grammar's language, or parses as JSON of the constraint's kind (schema checked with
    jsonschema where installed)."""
    if constraint.grammar is not None:
        return ITEM_GRAMMAR_TEXT.fullmatch(text) is not None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    if constraint.json_schema is None:
        return isinstance(value, dict)
    try:
        import jsonschema
    except ImportError:  # a bench-only install: parsing is the check
        return True
    return jsonschema.Draft202012Validator(constraint.json_schema).is_valid(value)


def section_batches(section: dict) -> dict[str, dict]:
    """The section's runs per batch size; a section saved before batch sizes were swept ran batch 1 alone."""
    if "batches" in section:
        return section["batches"]
    return {"1": {key: section[key] for key in ("workload", "variants")}}


def format_structured_section(section: dict) -> str:
    """The section as markdown, a table per batch size (the report's and the subcommand's)."""
    lines = []
    for batch_size, batch in section_batches(section).items():
        lines += [f"batch {batch_size} ({batch['workload']['num_requests']} prompts):", "",
                  "| variant | decode tok/s | over free text | first request's TTFT s | tokens / request | finished, valid |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for name, entry in batch["variants"].items():
            decode = entry["decode_tok_s"]
            over = f"{entry['decode_ratio']:.2f}x" if "decode_ratio" in entry else ""
            checks = f"{entry['finished'][0]}/{entry['finished'][1]}, {entry['valid']} valid" if "finished" in entry else ""
            lines.append(f"| {name} | {decode['median']:.1f} ({decode['min']:.1f}-{decode['max']:.1f}) | {over} | "
                         f"{entry['ttft_s']['median']:.3f} | {entry['output_tokens']:.0f} | {checks} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines).rstrip()
