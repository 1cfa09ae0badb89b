"""Benchmark workloads: deterministic from a seed, saved to and read from JSONL so peers replay them.

Every workload is a list of `BenchRequest`s of token ids cut from real text (the shared corpus
when present, else a built-in public-domain sample), tokenized with the model's tokenizer.
Outputs are forced to their target length (`ignore_eos`), so every engine does the same work.

| workload | what it stresses |
|---|---|
| mixed | throughput: 64 requests, ShareGPT-like skewed prompt (32-512) and output (16-256) lengths, all at t=0 |
| batch1 | single-stream decode: one 128-token prompt, 128 output tokens |
| shared-prefix | prefix caching: 64 requests = one 1,024-token system prompt + a distinct 32-token question |
| long-prefill | chunked prefill: 16 decoders running while 4 prompts of 2,048 tokens arrive |
| serve | HTTP serving: mixed-like requests sent at a rate or concurrency (see ember.bench.serve) |
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

WORKLOAD_NAMES = ("mixed", "batch1", "shared-prefix", "long-prefill", "serve")
CORPUS_FILES = ("tinyshakespeare.txt", "botchan.txt", "kjv.txt")
FORMAT_VERSION = 1

# Used only where ../shared/corpus is absent (Jane Austen, Pride and Prejudice, ch. 1; public domain).
BUILTIN_SAMPLE = """It is a truth universally acknowledged, that a single man in possession of a good fortune,
must be in want of a wife. However little known the feelings or views of such a man may be on his
first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families,
that he is considered the rightful property of some one or other of their daughters.
"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let at last?"
Mr. Bennet replied that he had not. "But it is," returned she; "for Mrs. Long has just been here, and
she told me all about it." Mr. Bennet made no answer. "Do you not want to know who has taken it?"
cried his wife impatiently. "You want to tell me, and I have no objection to hearing it."
This was invitation enough. "Why, my dear, you must know, Mrs. Long says that Netherfield is taken
by a young man of large fortune from the north of England; that he came down on Monday in a chaise
and four to see the place, and was so much delighted with it, that he agreed with Mr. Morris
immediately; that he is to take possession before Michaelmas, and some of his servants are to be in
the house by the end of next week." "What is his name?" "Bingley." "Is he married or single?"
"Oh! Single, my dear, to be sure! A single man of large fortune; four or five thousand a year.
What a fine thing for our girls!" "How so? How can it affect them?" "My dear Mr. Bennet," replied
his wife, "how can you be so tiresome! You must know that I am thinking of his marrying one of them."
"Is that his design in settling here?" "Design! Nonsense, how can you talk so! But it is very likely
that he may fall in love with one of them, and therefore you must visit him as soon as he comes."
"""


@dataclass
class BenchRequest:
    """One request of a workload.

    `arrival_s` is the offset from the start at which it is sent (serve); `after_tokens` holds a
    request back until the workload's first request has produced that many tokens (long-prefill:
    long prompts arrive while the decoders are mid-flight, whatever this machine's speed).
    `role` groups requests for reporting (e.g. "decoder", "long-prompt", "prefix").
    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float = 0.0
    after_tokens: int = 0
    role: str = "main"

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Workload:
    """A named, seeded list of requests plus the parameters that made it."""

    name: str
    seed: int
    requests: list[BenchRequest]
    params: dict = field(default_factory=dict)
    source: str = ""

    @property
    def total_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    @property
    def total_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    def save(self, path: Path) -> None:
        """JSONL: a header line (name, seed, params, source), then one line per request."""
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"format": FORMAT_VERSION, "workload": self.name, "seed": self.seed, "params": self.params, "source": self.source}
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            for request in self.requests:
                f.write(json.dumps(asdict(request)) + "\n")

    @classmethod
    def load(cls, path: Path) -> Workload:
        if not path.is_file():
            raise FileNotFoundError(f"workload file {path} does not exist; write one with `ember bench <workload> --save-workload {path}`")
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        if not lines:
            raise ValueError(f"workload file {path} is empty")
        header = json.loads(lines[0])
        if header.get("format") != FORMAT_VERSION or "workload" not in header:
            raise ValueError(f"{path} is not an ember workload file (format {FORMAT_VERSION} header expected on line 1)")
        requests = [BenchRequest(**json.loads(line)) for line in lines[1:]]
        return cls(header["workload"], header["seed"], requests, header.get("params", {}), header.get("source", ""))


# -- text to tokens --------------------------------------------------------------------------


def find_corpus_dir() -> Path | None:
    """`$EMBER_SHARED/corpus`, else ../shared/corpus beside the repository, else None."""
    candidates = []
    if os.environ.get("EMBER_SHARED"):
        candidates.append(Path(os.environ["EMBER_SHARED"]) / "corpus")
    candidates.append(Path(__file__).resolve().parents[3] / "shared" / "corpus")
    candidates.append(Path.cwd().parent / "shared" / "corpus")
    for candidate in candidates:
        if candidate.is_dir() and any((candidate / name).is_file() for name in CORPUS_FILES):
            return candidate
    return None


def corpus_text(max_chars: int = 400_000) -> tuple[str, str]:
    """(text, where it came from): the shared corpus files interleaved by paragraph, or the built-in sample."""
    folder = find_corpus_dir()
    if folder is None:
        return BUILTIN_SAMPLE * 8, "built-in sample (Pride and Prejudice, ch. 1)"
    parts, names = [], []
    per_file = max_chars // len(CORPUS_FILES)
    for name in CORPUS_FILES:
        path = folder / name
        if path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace")[:per_file])
            names.append(name)
    return "\n\n".join(parts), "shared corpus: " + ", ".join(names)


class TokenSource:
    """A long run of token ids from real text; prompts are slices of it at seeded offsets."""

    def __init__(self, token_ids: Sequence[int], bos_id: int | None = None, description: str = "") -> None:
        if len(token_ids) < 64:
            raise ValueError("the token source needs at least 64 tokens of text")
        self.token_ids = list(token_ids)
        self.bos_id = bos_id
        self.description = description

    @classmethod
    def from_tokenizer(cls, tokenizer, max_chars: int = 400_000) -> TokenSource:
        text, description = corpus_text(max_chars)
        bos = tokenizer.bos_id if getattr(tokenizer, "add_bos", False) else None
        return cls(tokenizer.encode(text), bos, description)

    def take(self, rng: random.Random, length: int) -> list[int]:
        """`length` consecutive tokens from a random offset (BOS first when the model wants one)."""
        prefix = [self.bos_id] if self.bos_id is not None else []
        need = length - len(prefix)
        ids = self.token_ids
        start = rng.randrange(len(ids))
        out = []
        while len(out) < need:
            out.extend(ids[start : start + need - len(out)])
            start = 0
        return prefix + out


# -- the workloads -------------------------------------------------------------------------------


def _skewed_length(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    """A log-normal length (long right tail, like ShareGPT's), clipped to [low, high]."""
    return int(min(high, max(low, round(rng.lognormvariate(math.log(median), sigma)))))


def mixed(source: TokenSource, seed: int = 0, num_requests: int = 64, max_prompt: int = 512, max_output: int = 256) -> Workload:
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        prompt_len = _skewed_length(rng, 160, 0.8, 32, max_prompt)
        output_len = _skewed_length(rng, 80, 0.8, 16, max_output)
        requests.append(BenchRequest(f"mixed-{i}", source.take(rng, prompt_len), output_len))
    params = {"num_requests": num_requests, "prompt_len": [32, max_prompt], "output_len": [16, max_output],
              "distribution": "log-normal (median 160 prompt / 80 output, sigma 0.8), clipped"}
    return Workload("mixed", seed, requests, params, source.description)


def batch1(source: TokenSource, seed: int = 0, prompt_len: int = 128, output_len: int = 128) -> Workload:
    rng = random.Random(seed)
    request = BenchRequest("batch1-0", source.take(rng, prompt_len), output_len)
    return Workload("batch1", seed, [request], {"prompt_len": prompt_len, "output_len": output_len}, source.description)


def shared_prefix(
    source: TokenSource, seed: int = 0, num_requests: int = 64, prefix_len: int = 1024, question_len: int = 32, output_len: int = 16
) -> Workload:
    rng = random.Random(seed)
    system_prompt = source.take(rng, prefix_len)
    no_bos = TokenSource(source.token_ids, None, source.description)
    requests = [
        BenchRequest(f"prefix-{i}", system_prompt + no_bos.take(rng, question_len), output_len, role="prefix")
        for i in range(num_requests)
    ]
    params = {"num_requests": num_requests, "prefix_len": prefix_len, "question_len": question_len, "output_len": output_len}
    return Workload("shared-prefix", seed, requests, params, source.description)


def long_prefill(
    source: TokenSource,
    seed: int = 0,
    num_decoders: int = 16,
    num_long: int = 4,
    long_prompt_len: int = 2048,
    decoder_prompt_len: int = 64,
    decoder_output_len: int = 128,
    long_output_len: int = 8,
) -> Workload:
    """Decoders start at once; long prompt k arrives once the decoders have made about (k+1)/(num_long+1) of their tokens."""
    rng = random.Random(seed)
    requests = [
        BenchRequest(f"decoder-{i}", source.take(rng, decoder_prompt_len), decoder_output_len, role="decoder")
        for i in range(num_decoders)
    ]
    for k in range(num_long):
        after = max(1, (k + 1) * decoder_output_len // (num_long + 1))
        requests.append(BenchRequest(f"long-{k}", source.take(rng, long_prompt_len), long_output_len, after_tokens=after, role="long-prompt"))
    params = {"num_decoders": num_decoders, "num_long": num_long, "long_prompt_len": long_prompt_len,
              "decoder_prompt_len": decoder_prompt_len, "decoder_output_len": decoder_output_len, "long_output_len": long_output_len}
    return Workload("long-prefill", seed, requests, params, source.description)


def serve(source: TokenSource, seed: int = 0, num_requests: int = 64, max_prompt: int = 512, max_output: int = 256, request_rate: float = float("inf")) -> Workload:
    """Mixed-like requests with Poisson arrivals at `request_rate` per second (inf: all at once)."""
    base = mixed(source, seed, num_requests, max_prompt, max_output)
    rng = random.Random(seed + 1)
    clock = 0.0
    for request in base.requests:
        request.request_id = request.request_id.replace("mixed", "serve")
        request.arrival_s = clock
        if request_rate != float("inf"):
            clock += rng.expovariate(request_rate)
    params = dict(base.params, request_rate=None if request_rate == float("inf") else request_rate)
    return Workload("serve", seed, base.requests, params, source.description)


BUILDERS = {"mixed": mixed, "batch1": batch1, "shared-prefix": shared_prefix, "long-prefill": long_prefill, "serve": serve}


def build(name: str, source: TokenSource, seed: int = 0, **params) -> Workload:
    """The named workload; `params` override its sizes (e.g. num_requests=16)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOAD_NAMES)}")
    return BUILDERS[name](source, seed=seed, **params)
