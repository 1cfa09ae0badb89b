"""`ember bench structured`: what holding the output to JSON costs, against free text, same run.

Batch 1, greedy, chat prompts that ask for a JSON description of an item. Five variants of one
engine, interleaved per repeat: free text, `json_object`, a `json_schema` of the fields the prompt
names, and that schema again on an engine that has run the workload once untimed (a server that has
served the schema before; its prompts also come from the prefix cache, so only its decode compares),
without and with n-gram speculation (the engine's K, adaptive: the keys the prompt names can be copied).
Each run builds a fresh engine, so the first request of a cold run pays for the vocabulary's byte
trie (in its TTFT, reported for that request: the later ones queue behind it at batch 1) and for the
masks of the recogniser states it meets first (in its decode). Each constrained output is checked:
finished (it ended before max_tokens) and, if so, parsed as JSON and validated against the schema.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
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
# name: (constraint, untimed passes of the workload first: a server that has served the schema before, speculation)
VARIANTS = {
    "free text": (None, 0, None),
    "json_object": (StructuredOutput(json_object=True), 0, None),
    "json_schema": (SCHEMA, 0, None),
    "json_schema, served before": (SCHEMA, 1, None),
    "json_schema, served before, n-gram": (SCHEMA, 1, "ngram"),
}


def build_structured_workload(tokenizer, seed: int, num_prompts: int, output_len: int) -> Workload:
    """`num_prompts` chat prompts asking for one item as JSON with the schema's fields."""
    rng = random.Random(seed)
    items = rng.sample(ITEMS, min(num_prompts, len(ITEMS)))
    fields = ", ".join(ITEM_SCHEMA["properties"])
    requests = [
        BenchRequest(f"structured-{i}", encode_chat(tokenizer, f"Describe {item} as a JSON object with the fields {fields} "
                     f"(category one of {', '.join(CATEGORIES)})."), output_len, role="structured")  # fmt: skip
        for i, item in enumerate(items)
    ]
    params = {"num_requests": len(requests), "output_len": output_len, "prompt_len": [r.prompt_len for r in requests]}
    return Workload("structured", seed, requests, params, "generated")


def bench_structured(options: BenchOptions, num_prompts: int = 3, output_len: int = 128) -> dict:
    """The section: each variant's decode rate, TTFT and output checks, and the ratios to free text."""
    from ember.tokenizers import load

    tokenizer = load(model_path(options.model))
    workload = build_structured_workload(tokenizer, options.seed, num_prompts, output_len)
    dtype = options.dtypes[0]
    runners: dict[str, Callable[[], RunResult]] = {
        name: lambda settings=EmberSettings(max_num_seqs=1, structured_output=constraint, untimed_passes=passes,
                                            speculative_method=method):
            run_ember(options.model, dtype, workload, settings)
        for name, (constraint, passes, method) in VARIANTS.items()
    }  # fmt: skip
    runs = _interleave(options, "structured", runners)
    variants = {name: _variant(runs[name], tokenizer, VARIANTS[name][0], output_len) for name in VARIANTS}
    plain = variants["free text"]
    for name, entry in variants.items():
        if name != "free text":
            entry["decode_ratio"] = ratio(entry["decode_tok_s"]["median"], plain["decode_tok_s"]["median"])
            entry["first_ttft_extra_s"] = entry["ttft_s"]["median"] - plain["ttft_s"]["median"]
    return {"dtype": dtype, "workload": workload.params, "repeats": options.repeats, "schema": ITEM_SCHEMA, "variants": variants}


def _variant(runs: list[RunResult], tokenizer, constraint: StructuredOutput | None, output_len: int) -> dict:
    ttfts = [run.requests[0].ttft_s for run in runs]  # the first request's: batch 1 queues the others behind it
    entry = {"decode_tok_s": spread([decode_tok_s(run) for run in runs]).to_dict(), "ttft_s": spread(ttfts).to_dict(),
             "output_tokens": median(t.output_tokens for run in runs for t in run.requests)}  # fmt: skip
    if constraint is not None:
        outputs = [tokenizer.decode(t.output_token_ids, skip_special_tokens=True) for t in runs[-1].requests]
        finished = [text for text, t in zip(outputs, runs[-1].requests, strict=True) if t.output_tokens < output_len]
        entry["finished"] = [len(finished), len(outputs)]
        entry["valid"] = sum(_conforms(text, constraint) for text in finished)
    return entry


def _conforms(text: str, constraint: StructuredOutput) -> bool:
    """Whether `text` parses as JSON of the constraint's kind (schema checked with jsonschema where installed)."""
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


def format_structured_section(section: dict) -> str:
    """The section as markdown (the report's and the subcommand's)."""
    lines = ["| variant | decode tok/s | over free text | first request's TTFT s | tokens / request | finished, valid |",
             "|---|---|---|---|---|---|"]
    for name, entry in section["variants"].items():
        decode = entry["decode_tok_s"]
        over = f"{entry['decode_ratio']:.2f}x" if "decode_ratio" in entry else ""
        checks = f"{entry['finished'][0]}/{entry['finished'][1]}, {entry['valid']} valid" if "finished" in entry else ""
        lines.append(f"| {name} | {decode['median']:.1f} ({decode['min']:.1f}-{decode['max']:.1f}) | {over} | "
                     f"{entry['ttft_s']['median']:.3f} | {entry['output_tokens']:.0f} | {checks} |")  # fmt: skip
    return "\n".join(lines)
