"""Tokens per 1,000 characters for several tokenizers over several languages: how much
more a language costs than English under each vocabulary (the "Korean/Hindi cost 2-3x"
claim, measured on the user's own text)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ember.tokenizers.base import Tokenizer


@dataclass(frozen=True)
class CostCell:
    """One tokenizer on one language's text."""

    tokenizer: str
    language: str
    characters: int
    tokens: int

    @property
    def tokens_per_1000_chars(self) -> float:
        return 1000.0 * self.tokens / max(self.characters, 1)


def encode_plain(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of `text` with special-token text treated as ordinary text where the tokenizer
    supports that (a comparison of vocabularies should not depend on markup)."""
    try:
        return tokenizer.encode(text, allowed_special=())  # type: ignore[call-arg]
    except TypeError:
        return tokenizer.encode(text)


def measure_costs(tokenizers: Mapping[str, Tokenizer], texts: Mapping[str, str]) -> list[CostCell]:
    """A cell per (tokenizer, language); texts are encoded line by line."""
    cells = []
    for name, tokenizer in tokenizers.items():
        for language, text in texts.items():
            tokens = sum(len(encode_plain(tokenizer, line)) for line in text.splitlines() if line)
            characters = sum(len(line) for line in text.splitlines() if line)
            cells.append(CostCell(name, language, characters, tokens))
    return cells


def format_table(cells: list[CostCell], baseline: str | None = "english") -> str:
    """A text table: rows are languages, columns tokenizers, values tokens per 1,000
    characters, and in parentheses the ratio to the baseline language when present."""
    tokenizers = list(dict.fromkeys(cell.tokenizer for cell in cells))
    languages = list(dict.fromkeys(cell.language for cell in cells))
    value = {(cell.tokenizer, cell.language): cell.tokens_per_1000_chars for cell in cells}
    width = max(12, *(len(name) + 2 for name in tokenizers))
    lines = ["language".ljust(14) + "".join(name.rjust(width + 8) for name in tokenizers)]
    for language in languages:
        row = language.ljust(14)
        for name in tokenizers:
            cost = value[(name, language)]
            base = value.get((name, baseline)) if baseline else None
            ratio = f" ({cost / base:.2f}x)" if base else ""
            row += f"{cost:.1f}{ratio}".rjust(width + 8)
        lines.append(row)
    return "\n".join(lines)


def plot_costs(cells: list[CostCell], path: str | Path) -> None:
    """A grouped bar chart (PNG) of tokens per 1,000 characters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokenizers = list(dict.fromkeys(cell.tokenizer for cell in cells))
    languages = list(dict.fromkeys(cell.language for cell in cells))
    value = {(cell.tokenizer, cell.language): cell.tokens_per_1000_chars for cell in cells}
    figure, axes = plt.subplots(figsize=(max(6, 1.2 * len(languages) * len(tokenizers) / 2), 4.5))
    width = 0.8 / max(len(tokenizers), 1)
    for offset, name in enumerate(tokenizers):
        positions = [index + offset * width for index in range(len(languages))]
        axes.bar(positions, [value[(name, lang)] for lang in languages], width, label=name)
    axes.set_xticks([index + 0.4 - width / 2 for index in range(len(languages))])
    axes.set_xticklabels(languages, rotation=30, ha="right")
    axes.set_ylabel("tokens per 1,000 characters")
    axes.set_title("Tokenizer cost by language")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
