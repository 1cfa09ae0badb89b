"""`ember bench prefix`: prompt tokens served from the prefix cache and TTFT, radix tree vs block hashes, same run.

Three workloads of token runs cut from the shared corpus, each arriving in rounds (a round's requests all
at once, the next round once it has finished), on one engine per variant that keeps its cache across rounds:

- multi-turn: conversations behind one short system prompt; turn t's prompt is the conversation so
  far (user messages and replies of uneven lengths, so turns end anywhere in a 16-token block) plus
  the next user message; round t holds turn t of every conversation;
- few-shot: an instruction, then examples drawn from one pool in a different order per prompt, then
  a question; prompts share their instruction and whatever run of examples an earlier prompt began with;
- shared-prefix: the suite's workload (one long system prompt, distinct questions), in one round.

The radix cache serves a prompt up to the token where it leaves everything cached; the hash cache
only up to the last whole block before that. The variants alternate per repeat.
"""

from __future__ import annotations

import random
from statistics import median

from ember.bench.ember_runner import EmberSettings, _run_continuous, make_engine
from ember.bench.stats import ratio, spread
from ember.bench.suite import BenchOptions, model_path
from ember.bench.workloads import BenchRequest, TokenSource, shared_prefix

CACHES = ("radix", "hash")
OUTPUT_LEN = 8  # tokens per reply: the bench measures prompts, decode only has to start


def multi_turn(source: TokenSource, seed: int, num_conversations: int, num_turns: int) -> list[list[BenchRequest]]:
    """Rounds of turns: round t is turn t of every conversation (its prompt: the conversation so far)."""
    rng = random.Random(seed)
    system = source.take(rng, 37)
    plain = TokenSource(source.token_ids, None, source.description)
    histories = [list(system) for _ in range(num_conversations)]
    rounds = []
    for turn in range(num_turns):
        requests = []
        for index, history in enumerate(histories):
            history += plain.take(rng, rng.randint(9, 40))  # the user's message
            requests.append(BenchRequest(f"chat-{index}-{turn}", list(history), OUTPUT_LEN, role="multi-turn"))
            history += plain.take(rng, rng.randint(12, 60))  # the reply the conversation keeps
        rounds.append(requests)
    return rounds


def few_shot(source: TokenSource, seed: int, num_prompts: int, round_size: int, pool_size: int = 8,
             num_shots: int = 4) -> list[list[BenchRequest]]:
    """Prompts of an instruction, `num_shots` of `pool_size` examples in a random order, and a question."""
    rng = random.Random(seed + 1)
    instruction = source.take(rng, 29)
    plain = TokenSource(source.token_ids, None, source.description)
    examples = [plain.take(rng, rng.randint(20, 50)) for _ in range(pool_size)]
    requests = []
    for index in range(num_prompts):
        shots = [token for example in rng.sample(examples, num_shots) for token in example]
        requests.append(BenchRequest(f"shots-{index}", instruction + shots + plain.take(rng, 20), OUTPUT_LEN, role="few-shot"))
    return [requests[start : start + round_size] for start in range(0, num_prompts, round_size)]


def bench_prefix(options: BenchOptions) -> dict:
    """The section: per workload and cache, prompt tokens served from the cache and TTFT; radix over hash."""
    from ember.tokenizers import load

    source = TokenSource.from_tokenizer(load(model_path(options.model)))
    dtype = options.dtypes[0]
    workloads = {
        "multi-turn": multi_turn(source, options.seed, options.scaled(12), 5),
        "few-shot": few_shot(source, options.seed, options.scaled(48), 8),
        "shared-prefix": [shared_prefix(source, options.seed, options.requests(64, "shared-prefix")).requests],
    }
    runs: dict[str, dict[str, list[dict]]] = {name: {cache: [] for cache in CACHES} for name in workloads}
    for repeat in range(options.repeats):
        for name, rounds in workloads.items():
            for cache in CACHES:
                options.tick(f"prefix: {name}, {cache} cache ({repeat + 1}/{options.repeats})")
                runs[name][cache].append(_run_rounds(options.model, dtype, rounds, cache))
    section = {"dtype": dtype, "repeats": options.repeats, "output_len": OUTPUT_LEN, "workloads": {}}
    for name, rounds in workloads.items():
        entry = {cache: _summary(runs[name][cache]) for cache in CACHES}
        entry["requests"] = sum(len(r) for r in rounds)
        entry["rounds"] = len(rounds)
        entry["served_ratio"] = ratio(entry["radix"]["served_tokens"], entry["hash"]["served_tokens"])
        entry["ttft_ratio"] = ratio(entry["radix"]["ttft_s"]["median"], entry["hash"]["ttft_s"]["median"])
        section["workloads"][name] = entry
    return section


def _run_rounds(model: str, dtype: str, rounds: list[list[BenchRequest]], cache: str) -> dict:
    """One pass of the rounds on a fresh engine: prompt tokens, tokens served from the cache, each request's TTFT."""
    engine = make_engine(model, dtype, EmberSettings(label=cache, prefix_cache=cache))
    prompt_tokens = served_tokens = 0
    ttfts = []
    for requests in rounds:
        timings, _ = _run_continuous(engine, requests, None)
        prompt_tokens += sum(t.prompt_len for t in timings.values())
        served_tokens += sum(t.num_cached_tokens for t in timings.values())
        ttfts += [t.first_token - t.arrival for t in timings.values() if t.first_token is not None]
    return {"prompt_tokens": prompt_tokens, "served_tokens": served_tokens, "mean_ttft_s": sum(ttfts) / len(ttfts)}


def _summary(runs: list[dict]) -> dict:
    # Which tokens a cache serves does not depend on timing: every repeat serves the same count.
    return {"prompt_tokens": runs[0]["prompt_tokens"], "served_tokens": median(r["served_tokens"] for r in runs),
            "hit_rate": median(r["served_tokens"] for r in runs) / runs[0]["prompt_tokens"],
            "ttft_s": spread([r["mean_ttft_s"] for r in runs]).to_dict()}


def format_prefix_section(section: dict) -> str:
    """The section as markdown (the report's and the subcommand's)."""
    lines = ["| workload | requests (rounds) | prompt tokens | served: radix | served: hash | radix / hash | "
             "mean TTFT ms: radix | mean TTFT ms: hash | TTFT radix / hash |", "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in section["workloads"].items():
        radix, hashed = entry["radix"], entry["hash"]
        lines.append(
            f"| {name} | {entry['requests']} ({entry['rounds']}) | {radix['prompt_tokens']} | "
            f"{radix['served_tokens']:.0f} ({radix['hit_rate']:.0%}) | {hashed['served_tokens']:.0f} ({hashed['hit_rate']:.0%}) | "
            f"{_times(entry['served_ratio'])} | {_ms(radix['ttft_s'])} | {_ms(hashed['ttft_s'])} | {_times(entry['ttft_ratio'])} |"
        )
    return "\n".join(lines)


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _ms(spread_dict: dict) -> str:
    return f"{1000 * spread_dict['median']:.0f} ({1000 * spread_dict['min']:.0f}-{1000 * spread_dict['max']:.0f})"
