"""llama.cpp's GGUF pre-tokenizers (`tokenizer.ggml.pre`): each name's split stages, as facts.

llama.cpp cuts text with a list of regexes applied in turn, each keeping its matches and the
gaps between them as pieces (HF's Split "Isolated"); the lists here are those of llama.cpp's
llama-vocab.cpp, written with the original tokenizer.json regexes where llama.cpp rewrote one
for its own regex engine (e.g. `\\p{Lu}` spelled as a lookahead), since Python's `regex` runs
the originals. `ignore_merges`: a piece that is itself a token is taken whole (Llama 3, Tekken).
Each stage costs a regex pass per piece, so where a stage list is slow, an equivalent single
pattern (`fused`) or shorter list (`fewer_stages`) cuts the same pieces in fewer passes; the
stages stay the reference they are tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from ember.tokenizers.text import deepseek_llm_split
from ember.tokenizers.text.patterns import (
    BAILING_PATTERN,
    GPT2_PATTERN,
    LLAMA3_PATTERN,
    O200K_PATTERN,
    QWEN2_PATTERN,
    QWEN35_PATTERN,
    SEED_CODER_PATTERN,
    SINGLE_DIGIT_PATTERN,
    TEKKEN_PATTERN,
    PreTokenizer,
)

DEEPSEEK_LLM_STAGES = (
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",  # noqa: E501, RUF001
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",  # noqa: RUF001
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
)


@cache
def deepseek_llm_pattern() -> str:
    """deepseek-llm's stages as one pattern (deepseek_llm_split), from the letter,
    punctuation and CJK-range classes of stages 2, 3 and 5; built on first use (it reads
    `regex`'s Unicode tables)."""
    stages = DEEPSEEK_LLM_STAGES
    return deepseek_llm_split.one_pattern(stages[1][4:-2], stages[2][4:-2], stages[4][1:-2])


DEEPSEEK_CODER_STAGES = (
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
)
# deepseek-coder's stages as two: newlines alone, letter and punctuation runs with one
# leading non-newline space (neither run can start inside the other, so one left-to-right
# pass finds what three passes find) and single numerals (the last stage isolates every one,
# whichever piece holds it, so doing it first cuts the same); then the CJK-range stage.
DEEPSEEK_CODER_FEWER_STAGES = (
    "[\r\n]|(?:(?![\r\n])\\s)?\\p{L}+|(?:(?![\r\n])\\s)?\\p{P}+|\\p{N}",
    DEEPSEEK_CODER_STAGES[3],
)
DEEPSEEK_V3_STAGES = (
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)

FALCON_STAGES = ("[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_PATTERN, "[0-9][0-9][0-9]")
# What llama.cpp uses when a file names no pre-tokenizer (or "default").
DEFAULT_STAGES = ("[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_PATTERN, "\\p{N}+", "[0-9][0-9][0-9]")


def _punctuation_first_gpt2(punctuation: str, space_joins_number: bool) -> str:
    """One pattern that cuts as the stages (punctuation runs, GPT-2, [\\p{N}+,] [0-9]{3}) do,
    found by hand and checked against the stage-by-stage loop (test_tok_gguf_pre_tokenizers):
    punctuation runs come first, so GPT-2 works between them (its contractions never apply,
    its `(?!\\S)` sees a punctuation run as the end of text); numbers are cut into [0-9]{3}
    from their left end; `space_joins_number`: a space before a number stays with it unless
    [0-9]{3} starts there (else the space is a piece of its own)."""
    p = punctuation
    lead = " ?" if space_joins_number else ""
    return (
        f"{p}+| ?\\p{{L}}+|[0-9]{{3}}|{lead}(?:(?![0-9]{{3}})\\p{{N}})+"
        f"| (?=[0-9]{{3}})| ?[^\\s\\p{{L}}\\p{{N}}{p[1:-1]}]+|\\s+(?![^\\s{p[1:-1]}])|\\s+"
    )


# Falcon keeps a space with the digits after it; "default" cuts it off (its \\p{N}+ stage).
FALCON_PATTERN = _punctuation_first_gpt2("[\\p{P}\\$\\+<=>\\^~\\|`]", True)
DEFAULT_PATTERN = _punctuation_first_gpt2("[\\p{P}\\$\\+<=>\\^~\\|]", False)
BLOOM_STAGES = (" ?[^(\\s|.,!?…。，、।۔،)]+",)  # noqa: RUF001
VIKING_STAGES = (*BLOOM_STAGES, "\\p{N}")
CHAMELEON_STAGES = (
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    GPT2_PATTERN,
)
_CHAMELEON_PUNCTUATION = "\\p{P}!-/:-@\\[-`{-~"
# Chameleon's stages after the sentinel and image ones as one: tabs, newlines, runs of four or
# two spaces, single numerals and punctuation come first (the stages take them before GPT-2
# sees the rest, and GPT-2 leaves each whole); GPT-2 then works between them, so its
# whitespace never takes a tab, newline or space pair and its `(?!\\S)` sees those as the end.
CHAMELEON_FEWER_STAGES = (
    *CHAMELEON_STAGES[:2],
    f"[\\t\\n]|    |  |\\p{{N}}|[{_CHAMELEON_PUNCTUATION}]| ?\\p{{L}}+"
    f"| ?[^\\s\\p{{L}}\\p{{N}}{_CHAMELEON_PUNCTUATION}]+"
    f"|(?:(?![\\t\\n]|  )\\s)+(?![^\\s\\p{{N}}{_CHAMELEON_PUNCTUATION}])|(?:(?![\\t\\n]|  )\\s)+",
)
SUPERBPE_STAGES = ("\\p{N}+", "(?=(\\d{3})+(?!\\d))")
DIGITS_THEN_GPT2 = (SINGLE_DIGIT_PATTERN, GPT2_PATTERN)


@dataclass(frozen=True)
class GGUFPreTokenizer:
    """How one `tokenizer.ggml.pre` value cuts text, and whether whole-token pieces skip merges."""

    stages: tuple[str, ...]
    ignore_merges: bool = False
    # Speed-ups that cut exactly as `stages` do (checked against the stage-by-stage loop in
    # test_tok_gguf_pre_tokenizers): one pattern whose matches are the pieces (every
    # character in one; or the function that builds it, where that costs time), or fewer
    # stages.
    fused: str | Callable[[], str] | None = None
    fewer_stages: tuple[str, ...] | None = None

    def build(self) -> PreTokenizer:
        if self.fused is not None:
            pattern = self.fused() if callable(self.fused) else self.fused
            return PreTokenizer((pattern,), is_complete=True)
        return PreTokenizer.from_stages(self.fewer_stages or self.stages)


def _table() -> dict[str, GGUFPreTokenizer]:
    llama3 = GGUFPreTokenizer((LLAMA3_PATTERN,), ignore_merges=True)
    groups: list[tuple[tuple[str, ...], GGUFPreTokenizer]] = [
        (("default",), GGUFPreTokenizer(DEFAULT_STAGES, fused=DEFAULT_PATTERN)),
        (
            ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0")
            + ("lfm2", "jina-v5-nano"),
            llama3,
        ),
        (("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), GGUFPreTokenizer((LLAMA3_PATTERN,))),
        (
            ("deepseek-llm",),
            GGUFPreTokenizer(DEEPSEEK_LLM_STAGES, fused=deepseek_llm_pattern),
        ),
        (
            ("deepseek-coder",),
            GGUFPreTokenizer(DEEPSEEK_CODER_STAGES, fewer_stages=DEEPSEEK_CODER_FEWER_STAGES),
        ),
        (
            ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"),
            GGUFPreTokenizer(DEEPSEEK_V3_STAGES),
        ),
        (("falcon",), GGUFPreTokenizer(FALCON_STAGES, fused=FALCON_PATTERN)),
        (
            ("gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de")
            + ("a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe")
            + ("mpt", "olmo", "jais", "exaone4", "trillion", "granite-docling"),
            GGUFPreTokenizer((GPT2_PATTERN,)),
        ),
        (
            ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b")
            + ("mellum2",),
            GGUFPreTokenizer(DIGITS_THEN_GPT2),
        ),
        (
            ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan")
            + ("solar-open", "grok-2"),
            GGUFPreTokenizer((QWEN2_PATTERN,)),
        ),
        (("qwen35",), GGUFPreTokenizer((QWEN35_PATTERN,))),
        (("poro-chat", "bloom", "gpt3-finnish"), GGUFPreTokenizer(BLOOM_STAGES)),
        (("viking",), GGUFPreTokenizer(VIKING_STAGES)),
        (("tekken",), GGUFPreTokenizer((TEKKEN_PATTERN,), ignore_merges=True)),
        (
            ("chameleon",),
            GGUFPreTokenizer(CHAMELEON_STAGES, fewer_stages=CHAMELEON_FEWER_STAGES),
        ),
        (
            ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
            GGUFPreTokenizer((O200K_PATTERN,)),
        ),
        (("superbpe",), GGUFPreTokenizer(SUPERBPE_STAGES)),
        (("bailingmoe", "bailingmoe2", "llada-moe"), GGUFPreTokenizer((BAILING_PATTERN,))),
        (("seed-coder",), GGUFPreTokenizer((SEED_CODER_PATTERN,))),
    ]
    return {name: spec for names, spec in groups for name in names}


GGUF_PRE_TOKENIZERS: dict[str, GGUFPreTokenizer] = _table()

# Named by llama.cpp but cut by hand-written code there, or not byte-level BPE at all.
NOT_EXPRESSIBLE = {
    "kimi-k2": "llama.cpp cuts it with custom Han-script code, not a regex list",
    "afmoe": "llama.cpp groups its digits with custom code (\\p{AFMoE_digits})",
    "gemma4": "a SentencePiece-style BPE on raw UTF-8, not a byte-level vocabulary",
    "sarvam-moe": "a SentencePiece-style BPE on raw UTF-8, not a byte-level vocabulary",
    "granite-embed-multi-311m": "a SentencePiece-style BPE on raw UTF-8",
    "whitespace": "a whitespace split over raw UTF-8, not a byte-level vocabulary",
}


def gguf_pre_tokenizer(name: str | None) -> GGUFPreTokenizer:
    """The split rules for a `tokenizer.ggml.pre` value (absent: llama.cpp's "default")."""
    spec = GGUF_PRE_TOKENIZERS.get(name or "default")
    if spec is not None:
        return spec
    reason = NOT_EXPRESSIBLE.get(name, "llama.cpp does not name it either")
    raise ValueError(
        f"GGUF pre-tokenizer {name!r} is not supported by ember.tokenizers ({reason}); "
        f"supported: {', '.join(sorted(GGUF_PRE_TOKENIZERS))}"
    )
