"""The seed's numeric claims, and the rule that turns a figure measured here into a verdict.

Each `Claim` quotes the seed (the LLM-infrastructure chapter our users read), says where in it,
which experiment of `ember bench seed` measures it and what figure of that experiment is compared
with the claimed range. The verdict is computed from the figure, never written by hand:

- holds: the figure lies in the claimed range (widened by `TOLERANCE` each side: a shared
  2-core machine measures ratios to about 10%);
- holds here with a different size: the effect is there, in the claimed direction, but
  outside the range;
- does not hold: no effect, the opposite one, or (for an exact claim: a count, a size) another value;
- not measurable here: the experiment could not produce the figure (the reason is recorded).

This module is free of torch: the report and the tests import it.
"""

from __future__ import annotations

from dataclasses import dataclass

HOLDS = "holds"
HOLDS_DIFFERENT_SIZE = "holds here with a different size"
DOES_NOT_HOLD = "does not hold"
NOT_MEASURABLE = "not measurable here"
VERDICTS = (HOLDS, HOLDS_DIFFERENT_SIZE, DOES_NOT_HOLD, NOT_MEASURABLE)

TOLERANCE = 0.10  # relative widening of a claimed range before a figure counts as outside it

# The seed as issue 53 quotes it: the chapter itself is not among the shared assets of this
# checkout, so each place names the chapter's topic the claim sits under.
SEED = "the seed, LLM-infrastructure chapter"


@dataclass(frozen=True)
class Claim:
    """One numeric claim of the seed and how its figure is judged.

    `low`..`high`: the claimed range in `unit`; `no_effect`: the figure that means "no effect"
    (1.0 for a speed-up, 0 for a saving); `is_exact`: the claim states a fact (a count, a size),
    so a figure outside the range is an error of the seed, not an effect of another size.
    `experiment`: the `ember bench seed` experiment that measures it; `is_gpu`: the claim is about
    GPUs, so where no GPU is present its figure is modelled from measured CPU figures and the
    hardware's published bandwidth and FLOPs.
    """

    id: str
    quote: str
    place: str
    experiment: str
    unit: str
    low: float
    high: float
    no_effect: float = 1.0
    is_exact: bool = False
    is_gpu: bool = False
    known_error: str | None = None  # what the seed gets wrong and the correct figure (issue 53's two, and one found here)

    def verdict(self, figure: float | None) -> str:
        """holds / holds here with a different size / does not hold / not measurable here, from `figure` alone."""
        if figure is None:
            return NOT_MEASURABLE
        low, high = self.low * (1 - TOLERANCE), self.high * (1 + TOLERANCE)
        if low <= figure <= high:
            return HOLDS
        if self.is_exact:
            return DOES_NOT_HOLD
        claimed_upward = self.high > self.no_effect
        has_effect = figure > self.no_effect * (1 + TOLERANCE) if claimed_upward else figure < self.no_effect * (1 - TOLERANCE)
        if self.no_effect == 0:
            has_effect = figure > 0 if claimed_upward else figure < 0
        return HOLDS_DIFFERENT_SIZE if has_effect else DOES_NOT_HOLD

    def claimed(self) -> str:
        """The claimed range as the report prints it."""
        if self.low == self.high:
            return f"{self.low:g} {self.unit}"
        return f"{self.low:g}-{self.high:g} {self.unit}"


def _place(topic: str) -> str:
    return f"{SEED}, {topic}"


CLAIMS: tuple[Claim, ...] = (
    Claim("continuous-batching", "continuous batching 10-20x", _place("serving: batching"), "batching", "x tok/s", 10, 20),
    Claim("paged-vs-hf", "PagedAttention 2-4x over HF transformers", _place("serving: PagedAttention / vLLM"), "batching",
          "x tok/s", 2, 4),
    Claim("kv-waste", "a request that generates 50 tokens but was allocated for 2048 wastes 97% of its KV cache",
          _place("serving: PagedAttention / KV fragmentation"), "kv-waste", "% wasted", 97, 97, no_effect=0, is_exact=True),
    Claim("prefix-caching", "prefix caching saves 50-90% of prefill", _place("serving: prefix caching"), "prefix",
          "% of prefill time", 50, 90, no_effect=0),
    Claim("flash-memory", "FlashAttention halves KV memory", _place("attention: FlashAttention"), "attention",
          "x less KV", 2, 2, is_exact=True, is_gpu=True,
          known_error="FlashAttention leaves the KV cache as it is (1x); it never materializes the N x N score matrix, so "
          "its saving is of activation memory, quadratic in N to linear"),
    Claim("flash-speed", "FlashAttention accelerates attention 2-4x", _place("attention: FlashAttention"), "attention",
          "x faster", 2, 4, is_gpu=True),
    Claim("spec-speedup", "speculative decoding 2-3x", _place("decoding: speculative decoding"), "spec", "x decode tok/s", 2, 3),
    Claim("spec-accepted", "3-5 tokens per step accepted", _place("decoding: speculative decoding"), "spec",
          "tokens/step", 3, 5),
    Claim("int4-memory", "INT4 2-4x memory", _place("quantization: INT4"), "quant", "x less than fp16", 2, 4),
    Claim("int4-throughput", "INT4 ~2x throughput", _place("quantization: INT4"), "quant", "x decode tok/s", 2, 2, is_gpu=True),
    Claim("q4km-memory", "Q4_K_M ~3.5x memory", _place("quantization: GGUF k-quants"), "quant", "x less than fp16", 3.5, 3.5),
    Claim("q4km-perplexity", "Q4_K_M ~1.5% perplexity", _place("quantization: GGUF k-quants"), "quant", "% perplexity",
          1.5, 1.5, no_effect=0),
    Claim("fp8-memory", "FP8 near-lossless 2x memory", _place("quantization: FP8"), "quant", "x less than fp16", 2, 2),
    Claim("fp8-quality", "FP8 near-lossless", _place("quantization: FP8"), "quant", "% perplexity", 0, 1, no_effect=0,
          is_exact=True),
    Claim("fp8-throughput", "FP8 2x throughput", _place("quantization: FP8"), "quant", "x decode tok/s", 2, 2, is_gpu=True),
    Claim("gqa-cache", "GQA-8 shrinks the cache 4-8x", _place("attention: GQA / MQA"), "attention-variants", "x less KV", 4, 8),
    Claim("mla-cache", "MLA ~93% KV reduction", _place("attention: MLA"), "attention-variants", "% less KV", 93, 93,
          no_effect=0),
    Claim("memory-bound", ">95% of decode time waiting on memory at batch 1", _place("inference: the memory wall"),
          "roofline", "% of step time", 95, 100, no_effect=0, is_gpu=True),
    Claim("tokenizer-korean", "GPT-3's tokenizer is 2-3x less efficient on Korean than GPT-4o's", _place("tokenization"),
          "tokenizer-languages", "x tokens", 2, 3),
    Claim("tokenizer-hindi", "GPT-3's tokenizer is 2-3x less efficient on Hindi than GPT-4o's", _place("tokenization"),
          "tokenizer-languages", "x tokens", 2, 3),
    Claim("tiktoken-speed", "tiktoken 3-6x faster than HF tokenizers", _place("tokenization"), "tokenizer-speed",
          "x MB/s", 3, 6),
    Claim("tp-allreduce", "TP needs an all-reduce per block", _place("parallelism: tensor parallelism"), "parallel",
          "all-reduces/layer", 1, 1, no_effect=0, is_exact=True,
          known_error="a layer (block) needs two all-reduces: after attention's output projection and after the MLP's down projection"),
    Claim("pp-activations", "PP only sends activations between stages", _place("parallelism: pipeline parallelism"), "parallel",
          "x one activation row", 1, 1, no_effect=0, is_exact=True),
    Claim("kv-llama2-7b", "the KV cache of Llama-2-7B at 4k context: 3.3 GB", _place("serving: KV cache size"), "kv-formula",
          "GB", 3.3, 3.3, no_effect=0, is_exact=True,
          known_error="2 x 32 layers x 4096 x 2 bytes x 4096 tokens = 2.15 GB (fp16), not 3.3 GB"),
)

CLAIMS_BY_ID = {claim.id: claim for claim in CLAIMS}
EXPERIMENTS = tuple(dict.fromkeys(claim.experiment for claim in CLAIMS))


def claims_of(ids: tuple[str, ...]) -> tuple[Claim, ...]:
    """The claims named, in the seed's order; raises naming the unknown ones."""
    unknown = [i for i in ids if i not in CLAIMS_BY_ID]
    if unknown:
        raise ValueError(f"--only: unknown claim(s) {', '.join(unknown)}; choose from {', '.join(CLAIMS_BY_ID)}")
    return tuple(claim for claim in CLAIMS if claim.id in ids)
