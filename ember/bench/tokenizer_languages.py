"""What a language costs under each of llama.cpp's vocabularies: the `ember tokenizers
compare` table over every `ggml-vocab-*.gguf` ember loads, on Korean, Hindi and English, with
a PNG.

The text is Firefox's messages in each language (Debian's language packs, which
.ci/fetch-firefox-l10n downloads): the messages every pack has form a parallel corpus, so
"Korean / English" is what saying the same things costs in tokens. The vocabularies are
llama.cpp's vocab-only GGUFs (.ci/fetch-llama-cpp-models). Where llama-cpp-python is
installed, every vocabulary's ids are checked against llama.cpp's own on every message.
Both folders are read where they lie; without them the section says how to get them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ember.tokenizers.compare import CostCell, encode_plain, measure_costs
from ember.tokenizers.deb_text import LANGUAGE_PACKS, find_language_packs, parallel_texts

FIREFOX_L10N_ENV = "EMBER_FIREFOX_L10N"
LLAMA_CPP_MODELS_ENV = "EMBER_LLAMA_CPP_MODELS"
PLOT_NAME = "tokenizer_languages.png"


def _cache_folder(name: str) -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ember" / name


def firefox_l10n_dir() -> Path:
    """$EMBER_FIREFOX_L10N, else the cache folder .ci/fetch-firefox-l10n fills."""
    return Path(os.environ.get(FIREFOX_L10N_ENV) or _cache_folder("firefox-l10n"))


def llama_cpp_models_dir() -> Path:
    """$EMBER_LLAMA_CPP_MODELS (e.g. a llama.cpp checkout's models/), else the cache folder
    .ci/fetch-llama-cpp-models fills."""
    return Path(os.environ.get(LLAMA_CPP_MODELS_ENV) or _cache_folder("llama.cpp-models"))


def missing_packs_reason(folder: Path, missing: list[str]) -> str:
    packages = " ".join(LANGUAGE_PACKS[language] for language in missing)
    return (
        f"Firefox language packs for {', '.join(missing)} are not in {folder}: run "
        f".ci/fetch-firefox-l10n (apt-get download {packages}, about 1 MB) or set "
        f"${FIREFOX_L10N_ENV} to a folder holding them"
    )


def load_parallel_texts(folder: Path) -> dict[str, str]:
    """language -> its messages, one a line, in the same order for every language; raises
    FileNotFoundError naming the fix when a pack is missing."""
    packs = find_language_packs(folder)
    missing = [language for language in LANGUAGE_PACKS if language not in packs]
    if missing:
        raise FileNotFoundError(missing_packs_reason(folder, missing))
    return parallel_texts(packs)


def run_language_costs(
    models_dir: Path | None = None,
    packs_dir: Path | None = None,
    vocabularies: list[str] | None = None,
    with_llama_cpp: bool = True,
) -> dict[str, Any]:
    """Tokens per 1,000 characters and relative to English for each vocabulary (`vocabularies`:
    NAMEs of ggml-vocab-NAME.gguf, default every one there), and mismatches against llama.cpp.

    Returns {"languages": {language: {"messages", "characters"}}, "rows": [{"vocabulary",
    "tokens": {language: n}, "per_1000_chars": {...}, "vs_english": {...},
    "llama_cpp_mismatches": n or None}], "unsupported": {vocabulary: reason}}, or
    {"skipped": reason} when the text or the vocabularies are absent.
    """
    models_dir = models_dir or llama_cpp_models_dir()
    packs_dir = packs_dir or firefox_l10n_dir()
    try:
        texts = load_parallel_texts(packs_dir)
    except FileNotFoundError as error:
        return {"skipped": str(error)}
    paths = sorted(models_dir.glob("ggml-vocab-*.gguf")) if models_dir.is_dir() else []
    if vocabularies is not None:
        paths = [path for path in paths if _vocabulary_name(path) in vocabularies]
    if not paths:
        return {
            "skipped": f"no ggml-vocab-*.gguf in {models_dir}: run .ci/fetch-llama-cpp-models "
            f"or set ${LLAMA_CPP_MODELS_ENV}"
        }
    lines = {
        language: [line for line in text.splitlines() if line] for language, text in texts.items()
    }
    section: dict[str, Any] = {
        "languages": {
            language: {"messages": len(found), "characters": sum(map(len, found))}
            for language, found in lines.items()
        },
        "rows": [],
        "unsupported": {},
    }
    for path in paths:
        row = _vocabulary_row(path, texts, lines, with_llama_cpp)
        if isinstance(row, str):
            section["unsupported"][_vocabulary_name(path)] = row
        else:
            section["rows"].append(row)
            print(
                f"[bench tokenizers] languages {row['vocabulary']}: {row['vs_english']}",
                file=sys.stderr,
            )
    return section


def _vocabulary_name(path: Path) -> str:
    return path.name[len("ggml-vocab-") : -len(".gguf")]


def _vocabulary_row(
    path: Path, texts: dict[str, str], lines: dict[str, list[str]], with_llama_cpp: bool
) -> dict[str, Any] | str:
    """One vocabulary's row, or why ember does not load it."""
    from ember.tokenizers import load

    name = _vocabulary_name(path)
    try:
        tokenizer = load(path)
    except ValueError as error:
        return str(error).split(": ", 1)[-1]
    cells: list[CostCell] = measure_costs({name: tokenizer}, texts)
    tokens = {cell.language: cell.tokens for cell in cells}
    english = tokens.get("english") or 1
    return {
        "vocabulary": name,
        "tokens": tokens,
        "per_1000_chars": {cell.language: round(cell.tokens_per_1000_chars, 1) for cell in cells},
        "vs_english": {language: round(count / english, 3) for language, count in tokens.items()},
        "llama_cpp_mismatches": _llama_cpp_mismatches(path, tokenizer, lines)
        if with_llama_cpp
        else None,
    }


def _llama_cpp_mismatches(path: Path, tokenizer: Any, lines: dict[str, list[str]]) -> int | None:
    """Messages whose ids differ from llama.cpp's (None without llama-cpp-python)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    reference = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return sum(
        reference.tokenize(line.encode(), add_bos=False, special=False)
        != encode_plain(tokenizer, line)
        for found in lines.values()
        for line in found
    )


def format_language_costs(section: dict[str, Any]) -> list[str]:
    """The section as markdown lines: one row per vocabulary."""
    if "skipped" in section:
        return [f"Tokens by language: skipped ({section['skipped']})."]
    languages = list(section["languages"])
    others = [language for language in languages if language != "english"]
    sizes = ", ".join(
        f"{language} {info['messages']} messages / {info['characters']} characters"
        for language, info in section["languages"].items()
    )
    lines = [
        "Tokens by language: Firefox's messages that every language pack has (Debian "
        f"{', '.join(LANGUAGE_PACKS.values())}; {sizes}), encoded message by message with each "
        "llama.cpp vocab GGUF ember loads. `/ english`: tokens for the same messages relative "
        "to English. llama.cpp: messages whose ids differ from llama-cpp-python's.",
        "",
        "| vocabulary | "
        + " | ".join(f"{language} tokens / 1k chars" for language in languages)
        + " | "
        + " | ".join(f"{language} / english" for language in others)
        + " | llama.cpp mismatches |",
        "|---|" + "---|" * (len(languages) + len(others) + 1),
    ]
    for row in section["rows"]:
        mismatches = row["llama_cpp_mismatches"]
        lines.append(
            f"| {row['vocabulary']} | "
            + " | ".join(f"{row['per_1000_chars'][language]:.1f}" for language in languages)
            + " | "
            + " | ".join(f"{row['vs_english'][language]:.2f}x" for language in others)
            + f" | {'-' if mismatches is None else mismatches} |"
        )
    if section["unsupported"]:
        lines += [
            "",
            "Not loaded: " + "; ".join(f"{k} ({v})" for k, v in section["unsupported"].items()),
        ]
    return lines


def plot_language_costs(section: dict[str, Any], path: Path) -> Path:
    """Two bar charts per vocabulary: tokens per 1,000 characters by language, and tokens for
    the same messages relative to English."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = section["rows"]
    names = [row["vocabulary"] for row in rows]
    languages = list(section["languages"])
    others = [language for language in languages if language != "english"]
    figure, (per_char, relative) = plt.subplots(
        2, 1, figsize=(max(7, 0.6 * len(rows)), 7), sharex=True
    )
    for axes, keys, metric, label in (
        (per_char, languages, "per_1000_chars", "tokens per 1,000 characters"),
        (relative, others, "vs_english", "tokens relative to English\n(same messages)"),
    ):
        width = 0.8 / len(keys)
        for offset, language in enumerate(keys):
            positions = [
                index + (offset - (len(keys) - 1) / 2) * width for index in range(len(rows))
            ]
            values = [row[metric][language] for row in rows]
            color = f"C{languages.index(language)}"  # one colour per language in both charts
            axes.bar(positions, values, width, label=language, color=color)
        axes.set_ylabel(label)
        axes.legend()
    relative.axhline(1.0, color="grey", linewidth=0.8)
    relative.set_xticks(range(len(rows)))
    relative.set_xticklabels(names, rotation=45, ha="right")
    per_char.set_title(
        "What Korean and Hindi cost under llama.cpp's vocabularies (Firefox's messages)"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
