"""What a user asks of one generation: how many tokens, how to pick them, when to stop."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.engine.rejection import check as _check
from ember.engine.structured.structured_output import StructuredOutput

# A bound on a single request's output, so a typo cannot pin the engine for hours.
MAX_TOKENS_LIMIT = 1_000_000
MAX_N = 128
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
LOGIT_BIAS_LIMIT = 100  # OpenAI's range for a logit_bias value
# OpenAI's range, served and offline alike: past 2 the distribution is close to uniform noise on any vocabulary,
# and a request valid here stays valid at any OpenAI-compatible provider a gateway may send it to.
MAX_TEMPERATURE = 2.0


@dataclass
class SamplingParams:
    """Sampling and stopping rules of one request; validated on construction, completely: every field's range is
    checked here and nowhere else (RequestRejected names the field). What depends on the engine (token ids inside
    its vocabulary, the context window, the KV cache) is `RequestLimits.check`'s.

    `temperature == 0` means greedy. `top_k <= 0` and `top_p == 1` disable those filters.
    `logprobs=k` returns the sampled token's logprob plus the `k` most likely alternatives
    at each step (`k=0`: the sampled token only); `prompt_logprobs` likewise for prompt tokens.
    Logprobs are those of the model's raw distribution, before penalties and filters.
    A `seed` makes the request's samples reproducible whatever else shares its batch.
    `allow_speculation=False` opts this request out of the engine's speculative decoding.
    `embed` (vLLM's embed task on a decoder model) makes the request return its prompt's embedding, the final hidden
    state at the last prompt token, L2-normalised, and generate nothing (one sequence; `max_tokens` 1).
    `logit_bias` adds its value to the logit of each token id before penalties, filters and the
    choice (OpenAI's: -100 all but bans a token, +100 all but forces it).
    `allowed_token_ids` (vLLM's) lets only those ids be sampled; `bad_words` (vLLM's) are words the output may
    not contain: each is tokenized as written and with a leading space, and a word's last token is banned
    wherever the output so far ends with the rest of it (the engine tokenizes them with its tokenizer).
    `structured_output` holds the output to a shape (a JSON object, a schema's value, one of fixed strings,
    text a regular expression matches):
    only tokens that keep it possible may be drawn, and the sequence stops when nothing more can follow.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    allow_speculation: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = field(default_factory=list)
    structured_output: StructuredOutput | None = None
    embed: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self.logit_bias = dict(self.logit_bias or {})  # None: no bias
        self.allowed_token_ids = None if self.allowed_token_ids is None else list(self.allowed_token_ids)
        self.bad_words = list(self.bad_words or [])
        self._validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def restricts_tokens(self) -> bool:
        """Whether a logit bias, an allowed list or bad words change the logits the choice is made from."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words)

    @property
    def has_penalties(self) -> bool:
        """Whether logits depend on the tokens generated so far (so drafted positions would need them)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def _validate(self) -> None:
        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"an integer from 1 to {MAX_N}")
        if self.max_tokens is not None:
            _check(
                _is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_TOKENS_LIMIT,
                "max_tokens",
                f"an integer from 1 to {MAX_TOKENS_LIMIT}",
            )
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "a non-negative integer")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens", "at most max_tokens")
        _check(_in(self.temperature, 0.0, MAX_TEMPERATURE), "temperature", f"a number from 0 to {MAX_TEMPERATURE:g}")
        _check(_in(self.top_p, 0.0, 1.0) and self.top_p > 0.0, "top_p", "a number in (0, 1]")
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", "-1, 0 (off) or a positive integer")
        _check(_in(self.min_p, 0.0, 1.0), "min_p", "a number from 0 to 1")
        _check(_in(self.presence_penalty, -2.0, 2.0), "presence_penalty", "a number from -2 to 2")
        _check(_in(self.frequency_penalty, -2.0, 2.0), "frequency_penalty", "a number from -2 to 2")
        _check(_in(self.repetition_penalty, 0.0, 2.0) and self.repetition_penalty > 0.0, "repetition_penalty", "a number in (0, 2]")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "a list of non-empty strings")
        _check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} strings")
        _check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids", "non-negative token ids")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check(_is_int(value) and 0 <= value <= MAX_LOGPROBS, name, f"an integer from 0 to {MAX_LOGPROBS}")
        _check(
            all(_is_int(t) and t >= 0 and _in(b, -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT) for t, b in self.logit_bias.items()),
            "logit_bias", f"a map of non-negative token ids to numbers from {-LOGIT_BIAS_LIMIT} to {LOGIT_BIAS_LIMIT}",
        )
        if self.allowed_token_ids is not None:
            _check(bool(self.allowed_token_ids) and all(_is_int(t) and t >= 0 for t in self.allowed_token_ids),
                   "allowed_token_ids", "a non-empty list of non-negative token ids")
        _check(all(isinstance(w, str) and w.strip() for w in self.bad_words), "bad_words", "a list of non-blank strings")
        if self.embed:
            _check(self.n == 1 and self.max_tokens == 1, "embed", "asked with n=1 and max_tokens=1 (an embedding generates nothing)")
        _check(self.structured_output is None or isinstance(self.structured_output, StructuredOutput), "structured_output", "a StructuredOutput or None")
        if self.seed is not None:
            _check(_is_int(self.seed) and -(2**63) <= self.seed < 2**63, "seed", "a 64-bit integer")


def embedding_params() -> SamplingParams:
    """The params of an embedding request (`embed`): one sequence, nothing generated."""
    return SamplingParams(max_tokens=1, temperature=0.0, embed=True)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in(value: object, low: float, high: float) -> bool:
    """Whether `value` is a number (not a bool) from `low` to `high`."""
    return isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high
