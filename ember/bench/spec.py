"""`ember bench spec`: ember with speculative decoding against ember without, in the same run.

Three parts, each reported as same-run ratios (median of interleaved repeats):
- batch 1, greedy, on input-grounded workloads (code editing, quoting summaries) and a free-text
  control: output tok/s with each proposer over plain decoding, acceptance rate, mean accepted
  length, draft and verify time, and the acceptance histogram (a PNG); beside them, from the plain
  run's own outputs, the most prompt lookup could buy on each workload (`lookup_ceiling`);
- a batch sweep on the code-editing workload: where speculation stops paying as the batch grows;
- the `mixed` workload (continuous batching, many sequences at once) with and without n-gram;
- with a sibling pair (`SiblingPair`: a larger target and a smaller model of its family, same
  tokenizer), batch 1 on the same workloads with that target: plain, n-gram, and the small model
  as the draft model.

The "medusa" proposer needs heads: `--medusa-heads DIR`, or heads this bench trains itself on
the shared corpus (a bounded number of steps, a few minutes on a laptop CPU), cached under
`$EMBER_HOME/medusa/<base model fingerprint>-...` so re-runs reuse them. The "eagle" proposer's
head likewise (`--eagle-head DIR`, or trained here and cached under `$EMBER_HOME/eagle/`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ember.bench.ember_runner import EmberSettings, run_ember
from ember.bench.lookup_ceiling import LookupCeiling, lookup_ceiling, overall_ceiling
from ember.bench.results import RunResult
from ember.bench.spec_workloads import SPEC_WORKLOADS, build_spec_workload
from ember.bench.stats import ratio, spread
from ember.bench.suite import BenchOptions, SiblingPair, _interleave, make_workload, model_path
from ember.bench.workloads import Workload
from ember.engine.config import MAX_SPECULATIVE_TOKENS, default_speculative_tokens


def draft_length_cap(spec: SpecBenchOptions, method: str) -> int:
    """The K `method` runs with: the one given, else the engine's default for it."""
    return spec.num_speculative_tokens or default_speculative_tokens(method)


@dataclass(frozen=True)
class SpecBenchOptions:
    """What `ember bench spec` compares: proposers, draft length, batch sizes, sizes of the workloads."""

    methods: tuple[str, ...] = ("ngram",)
    num_speculative_tokens: int | None = None  # None: each proposer's engine default (`default_speculative_tokens`)
    draft_model: str | None = None
    draft_dtype: str | None = None
    medusa_heads: str | None = None  # None: trained here (and cached) when "medusa" is compared
    medusa_train_steps: int = 160  # 4 per batch of target hidden states: 40 target forwards of 4 x 128 tokens
    eagle_head: str | None = None  # None: trained here (and cached) when "eagle" is compared
    eagle_train_steps: int = 320  # 4 per batch, as Medusa's: 80 target forwards of 4 x 128 tokens
    train_replies: int = 96  # heads trained here learn from the target's own replies to corpus prompts (0: the corpus)
    num_prompts: int = 3
    output_len: int = 128
    batch_sizes: tuple[int, ...] = (1, 4, 8, 16)
    mixed_requests: int = 16
    mixed_max_output: int = 128  # the mixed workload's output lengths are clipped here
    plot_path: Path | None = None
    sibling: SiblingPair | None = None
    sibling_repeats: int | None = None  # at most this many repeats of the sibling pair's runs (None: the bench's)


def _settings(method: str | None, spec: SpecBenchOptions, max_num_seqs: int | None) -> EmberSettings:
    if method is None:
        return EmberSettings(label="ember", max_num_seqs=max_num_seqs)
    return EmberSettings(
        label=f"ember + {method}",
        max_num_seqs=max_num_seqs,
        speculative_method=method,
        num_speculative_tokens=draft_length_cap(spec, method),
        draft_model=spec.draft_model if method == "draft" else None,
        draft_dtype=spec.draft_dtype if method == "draft" else None,
        medusa_heads=spec.medusa_heads if method == "medusa" else None,
        eagle_head=spec.eagle_head if method == "eagle" else None,
    )


def _runners(options: BenchOptions, spec: SpecBenchOptions, workload: Workload, max_num_seqs: int | None,
             methods: tuple[str, ...]) -> dict[str, Callable[[], RunResult]]:
    dtype = options.dtypes[0]
    runners: dict[str, Callable[[], RunResult]] = {
        "plain": lambda: run_ember(options.model, dtype, workload, _settings(None, spec, max_num_seqs))
    }
    for method in methods:
        runners[method] = lambda method=method: run_ember(options.model, dtype, workload, _settings(method, spec, max_num_seqs))
    return runners


def decode_tok_s(run: RunResult) -> float:
    """Tokens after each request's first, over the time after its first (prefill left out)."""
    tokens = sum(t.output_tokens - 1 for t in run.requests if t.first_token is not None and t.finished is not None)
    seconds = _decode_seconds(run)
    return tokens / seconds if seconds > 0 else 0.0


def _decode_seconds(run: RunResult) -> float:
    """The time a run's finished requests spent after their first token."""
    return sum(t.finished - t.first_token for t in run.requests if t.first_token is not None and t.finished is not None)


def _lookup_ceiling(workload: Workload, plain: list[RunResult], depth: int) -> dict:
    """What prompt lookup could at most buy on the plain run's greedy outputs (`ember.bench.lookup_ceiling`).

    `decode`: the oracle's tokens per step, a bound on the decode speed-up; `overall`: that bound applied to
    the plain runs' decode share of their time (median), a bound on the output tok/s ratio.
    """
    prompts = {r.request_id: r.prompt_token_ids for r in workload.requests}
    timings = plain[0].requests  # greedy: every plain run produced the same tokens

    def decode(k: int) -> float:
        return sum((lookup_ceiling(prompts[t.request_id], t.output_token_ids, k) for t in timings), LookupCeiling(0, 0)).tokens_per_step

    share = statistics.median(decode_share(run) for run in plain)
    at_depth, deepest = decode(depth), decode(MAX_SPECULATIVE_TOKENS)
    return {"depth": depth, "decode": at_depth, "overall": overall_ceiling(at_depth, share), "decode_share": share,
            "max_depth": MAX_SPECULATIVE_TOKENS, "max_depth_decode": deepest, "max_depth_overall": overall_ceiling(deepest, share)}


def decode_share(run: RunResult) -> float:
    """The share of a run's wall time its requests spent after their first token (batch 1: one request at a time)."""
    return min(1.0, _decode_seconds(run) / run.wall_s) if run.wall_s > 0 else 0.0


def _entry(runs: dict[str, list[RunResult]]) -> dict:
    """Per engine: tok/s and decode tok/s spreads, speculation counters of its median run; ratios to plain."""
    entry: dict = {}
    for name, rs in runs.items():
        extra = rs[0].extra
        entry[name] = {
            "label": rs[0].engine,
            "tok_s": spread([r.output_tok_s for r in rs]).to_dict(),
            "decode_tok_s": spread([decode_tok_s(r) for r in rs]).to_dict(),
            "acceptance_rate": spread([r.extra.get("spec_acceptance_rate", 0.0) for r in rs]).to_dict()["median"],
            "mean_accepted_length": spread([r.extra.get("spec_mean_accepted_length", 0.0) for r in rs]).to_dict()["median"],
            "draft_time_s": extra.get("spec_draft_time_s", 0.0),
            "verify_time_s": extra.get("spec_verify_time_s", 0.0),
            "accepted_histogram": [sum(col) for col in zip(*(r.extra.get("spec_accepted_histogram") or [0] for r in rs), strict=False)],
            "num_steps": spread([r.extra.get("num_steps", 0) for r in rs]).to_dict()["median"],
        }
    plain = entry["plain"]
    for name in runs:
        if name != "plain":
            entry[name]["ratio"] = ratio(entry[name]["tok_s"]["median"], plain["tok_s"]["median"])
            entry[name]["decode_ratio"] = ratio(entry[name]["decode_tok_s"]["median"], plain["decode_tok_s"]["median"])
    return entry


def bench_spec(options: BenchOptions, spec: SpecBenchOptions) -> dict:
    """Every part of the speculation benchmark; returns the section (and draws the histogram plot)."""
    from ember.tokenizers import load

    tokenizer = load(model_path(options.model))
    if "medusa" in spec.methods and spec.medusa_heads is None:
        spec = replace(spec, medusa_heads=str(cached_medusa_heads(options.model, options.dtypes[0], spec, tokenizer)))
    if "eagle" in spec.methods and spec.eagle_head is None:
        spec = replace(spec, eagle_head=str(cached_eagle_head(options.model, options.dtypes[0], spec, tokenizer)))
    section: dict = {"dtype": options.dtypes[0], "num_speculative_tokens": {m: draft_length_cap(spec, m) for m in spec.methods},
                     "draft_model": spec.draft_model, "draft_dtype": spec.draft_dtype, "medusa_heads": spec.medusa_heads,
                     "eagle_head": spec.eagle_head, "batch1": {}, "batch_sweep": {}}
    for name in SPEC_WORKLOADS:
        workload = build_spec_workload(name, tokenizer, options.seed, spec.num_prompts, spec.output_len)
        runs = _interleave(options, f"spec batch1 {name}", _runners(options, spec, workload, 1, spec.methods))
        section["batch1"][name] = dict(_entry(runs), prompt_len=workload.params["prompt_len"], output_len=spec.output_len,
                                       lookup_ceiling=_lookup_ceiling(workload, runs["plain"], draft_length_cap(spec, "ngram")))
    sweep_size = max(spec.batch_sizes, default=0)
    if sweep_size > 1:
        grounded = build_spec_workload("code-edit", tokenizer, options.seed + 1, sweep_size, spec.output_len)
        for batch in spec.batch_sizes:
            subset = Workload(grounded.name, grounded.seed, grounded.requests[:batch], grounded.params, grounded.source)
            runs = _interleave(options, f"spec sweep batch {batch}", _runners(options, spec, subset, batch, ("ngram",)))
            section["batch_sweep"][str(batch)] = _entry(runs)
        section["crossover_batch"] = _crossover(section["batch_sweep"])
    if spec.mixed_requests:
        # Its own size: never saved over the `mixed` section's workload file (same workload name).
        unsaved = replace(options, workload_dir=None, save_workload=None)
        mixed = make_workload(unsaved, "mixed", num_requests=spec.mixed_requests, max_output=spec.mixed_max_output)
        runs = _interleave(options, "spec mixed", _runners(options, spec, mixed, None, ("ngram",)))
        section["mixed"] = dict(_entry(runs), num_requests=spec.mixed_requests)
    if spec.sibling is not None:
        section["sibling"] = _bench_sibling(options, spec, spec.sibling)
    if spec.plot_path is not None:
        section["plot"] = str(plot_acceptance(section, spec.plot_path))
    return section


SIBLING_METHODS = ("ngram", "draft")


def _bench_sibling(options: BenchOptions, spec: SpecBenchOptions, pair: SiblingPair) -> dict:
    """Batch 1 on every workload with the pair's target: plain, n-gram, and the smaller sibling drafting."""
    from ember.tokenizers import load

    repeats = options.repeats if spec.sibling_repeats is None else min(options.repeats, spec.sibling_repeats)
    target_options = replace(options, model=pair.target, dtypes=(pair.dtype,), repeats=repeats)
    pair_spec = replace(spec, draft_model=pair.draft, draft_dtype=pair.dtype)
    tokenizer = load(model_path(pair.target))
    batch1 = {}
    for name in SPEC_WORKLOADS:
        workload = build_spec_workload(name, tokenizer, options.seed, spec.num_prompts, spec.output_len)
        runs = _interleave(target_options, f"spec sibling {name}", _runners(target_options, pair_spec, workload, 1, SIBLING_METHODS))
        batch1[name] = dict(_entry(runs), prompt_len=workload.params["prompt_len"], output_len=spec.output_len,
                            lookup_ceiling=_lookup_ceiling(workload, runs["plain"], draft_length_cap(spec, "ngram")))
    return {"target": pair.target, "draft": pair.draft, "dtype": pair.dtype, "repeats": repeats, "batch1": batch1}


def cached_medusa_heads(model: str, dtype: str, spec: SpecBenchOptions, tokenizer) -> Path:
    """Heads for `model` trained on the shared corpus for `spec.medusa_train_steps` steps; reused when already cached."""
    from ember.bench.ember_runner import loaded_weights
    from ember.engine.spec.medusa_heads import CONFIG_FILE, model_identity
    from ember.training.medusa import MedusaTrainingConfig, train_heads_for

    target = loaded_weights(model, dtype).model
    config = MedusaTrainingConfig(num_heads=draft_length_cap(spec, "medusa"), steps=spec.medusa_train_steps, steps_per_batch=4,
                                  self_generated=spec.train_replies)
    name = (f"{model_identity(target).key}-{config.num_heads}heads-{config.steps}steps-{config.steps_per_batch}perbatch"
            f"-{config.self_generated}replies")
    folder = ember_cache("medusa", name)
    if not (folder / CONFIG_FILE).is_file():
        tokens = _training_tokens(model, dtype, tokenizer, config, "Medusa heads", "--medusa-heads")
        train_heads_for(target, tokens, folder, config, show_progress=True)
    return folder


def cached_eagle_head(model: str, dtype: str, spec: SpecBenchOptions, tokenizer) -> Path:
    """An EAGLE-style head for `model` trained on the shared corpus for `spec.eagle_train_steps` steps; reused when cached."""
    from ember.bench.ember_runner import loaded_weights
    from ember.engine.spec.eagle_head import CONFIG_FILE
    from ember.engine.spec.medusa_heads import model_identity
    from ember.training.eagle import EagleTrainingConfig, train_eagle_head_for

    target = loaded_weights(model, dtype).model
    config = EagleTrainingConfig(steps=spec.eagle_train_steps, steps_per_batch=4, self_generated=spec.train_replies)
    name = f"{model_identity(target).key}-{config.steps}steps-{config.steps_per_batch}perbatch-{config.self_generated}replies"
    folder = ember_cache("eagle", name)
    if not (folder / CONFIG_FILE).is_file():
        tokens = _training_tokens(model, dtype, tokenizer, config, "EAGLE head", "--eagle-head")
        train_eagle_head_for(target, tokens, folder, config, show_progress=True)
    return folder


def _training_tokens(model: str, dtype: str, tokenizer, config, what: str, flag: str) -> list[int]:
    """The shared corpus's tokens, or the target's replies to prompts made from it (`config.self_generated`)."""
    from ember.bench.ember_runner import loaded_weights
    from ember.training.distillation import training_tokens

    return training_tokens(loaded_weights(model, dtype), model, dtype, tokenizer, shared_corpus(what, flag), config,
                           show_progress=True)


def ember_cache(kind: str, name: str) -> Path:
    """Where this bench keeps what it trained: `$EMBER_HOME/<kind>/<name>`."""
    from ember.models.registry import ember_home

    return ember_home() / kind / name


def shared_corpus(what: str, flag: str) -> list[Path]:
    """The shared corpus files to train on; raises naming `flag` (bring your own) when there is none."""
    from ember.bench.workloads import CORPUS_FILES, find_corpus_dir

    corpus_dir = find_corpus_dir()
    if corpus_dir is None:
        raise ValueError(f"no shared corpus to train the {what} on; set EMBER_SHARED or pass {flag} DIR")
    return [corpus_dir / name for name in CORPUS_FILES if (corpus_dir / name).is_file()]


def _crossover(sweep: dict) -> int | None:
    """The smallest swept batch size at which n-gram speculation no longer pays (ratio < 1), if any."""
    for batch, entry in sorted(sweep.items(), key=lambda item: int(item[0])):
        if (entry["ngram"]["ratio"] or 0.0) < 1.0:
            return int(batch)
    return None


def plot_acceptance(section: dict, path: Path) -> Path:
    """Bar charts: how many drafts each verification kept, per workload and proposer (batch 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(section["batch1"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.4), squeeze=False)
    for ax, name in zip(axes[0], workloads, strict=True):
        entry = section["batch1"][name]
        methods = [m for m in entry if isinstance(entry[m], dict) and "accepted_histogram" in entry[m] and m != "plain"]
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            counts = entry[method]["accepted_histogram"]
            total = sum(counts) or 1
            xs = [k + i * width for k in range(len(counts))]
            label = f"{method}: accept {entry[method]['acceptance_rate']:.0%}, x{entry[method]['ratio'] or 0:.2f}"
            ax.bar(xs, [c / total for c in counts], width=width, label=label)
        ax.set_title(name)
        ax.set_xlabel("drafted tokens kept per verification")
        ax.set_ylabel("share of verifications")
        ax.legend(fontsize=7)
    fig.suptitle(f"ember speculative decoding, batch 1, greedy ({draft_lengths_text(section)})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_spec_section(section: dict) -> str:
    """Plain-text table of the section for the terminal."""
    lines = [f"speculative decoding (dtype {section['dtype']}, {draft_lengths_text(section)})", "", "batch 1, greedy:"]
    lines += _batch1_lines(section["batch1"])
    if "sibling" in section:
        sibling = section["sibling"]
        lines.append(f"batch 1, greedy, target {Path(sibling['target']).name}, draft {Path(sibling['draft']).name} ({sibling['dtype']}):")
        lines += _batch1_lines(sibling["batch1"])
    if section["batch_sweep"]:
        lines.append("batch sweep (code-edit, n-gram over plain, tok/s):")
        for batch, entry in section["batch_sweep"].items():
            lines.append(f"  batch {batch:>3s}: x{entry['ngram']['ratio'] or 0:.2f}, accept {entry['ngram']['acceptance_rate']:.0%}")
        crossover = section.get("crossover_batch")
        lines.append(f"  crossover: {'none within the sweep' if crossover is None else f'batch {crossover}'}")
    if "mixed" in section:
        data = section["mixed"]["ngram"]
        lines.append(f"mixed ({section['mixed']['num_requests']} requests): n-gram x{data['ratio'] or 0:.2f} tok/s, "
                     f"accept {data['acceptance_rate']:.0%}")
    if "plot" in section:
        lines.append(f"acceptance histogram: {section['plot']}")
    return "\n".join(lines)


def draft_lengths_text(section: dict) -> str:
    """'K=4' where every proposer ran one K (and in results before per-proposer K), else 'K: ngram 8, draft 4'."""
    caps = section["num_speculative_tokens"]
    if isinstance(caps, int) or len(set(caps.values())) == 1:
        return f"K={caps if isinstance(caps, int) else next(iter(caps.values()))}"
    return "K: " + ", ".join(f"{method} {k}" for method, k in caps.items())


def ceiling_text(entry: dict) -> str:
    """A workload's prompt-lookup ceiling as the reports show it ('' where the run predates it)."""
    ceiling = entry.get("lookup_ceiling")
    if not ceiling:
        return ""
    return (f"lookup ceiling x{ceiling['overall']:.2f} at K={ceiling['depth']} (decode x{ceiling['decode']:.2f}), "
            f"x{ceiling['max_depth_overall']:.2f} at K={ceiling['max_depth']} (decode x{ceiling['max_depth_decode']:.2f})")


def _batch1_lines(batch1: dict) -> list[str]:
    lines = []
    for name, entry in batch1.items():
        if ceiling := ceiling_text(entry):
            lines.append(f"  {name:14s} {ceiling}")
        for method, data in entry.items():
            if isinstance(data, dict) and "tok_s" in data and method != "plain":
                lines.append(
                    f"  {name:14s} {method:6s} x{data['ratio'] or 0:.2f} tok/s (decode x{data['decode_ratio'] or 0:.2f}), "
                    f"accept {data['acceptance_rate']:.0%}, mean accepted length {data['mean_accepted_length']:.2f}, "
                    f"draft {data['draft_time_s']:.2f}s, verify {data['verify_time_s']:.2f}s "
                    f"[plain {entry['plain']['tok_s']['median']:.1f} tok/s]"
                )
    return lines


NEVER_DRAFTED = "never drafted"


def acceptance_text(data: dict) -> str:
    """A proposer's acceptance rate as the report shows it; 'never drafted' where adaptive K kept it off throughout."""
    if not any(data.get("accepted_histogram") or []):
        return NEVER_DRAFTED
    return f"{data['acceptance_rate']:.0%}"
