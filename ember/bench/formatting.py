"""How a measured number reads in a report's table cell or the terminal: "n/a" where nothing was measured.

Kept apart from the report and the printing so that any bench can format its own rows
without importing the report (which imports every bench's results).
"""

from __future__ import annotations


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{suffix}"


def fmt_spread(data: dict | None, digits: int = 1) -> str:
    """'median (min-max)' of a repeated measurement."""
    if not data:
        return "n/a"
    return f"{data['median']:,.{digits}f} ({data['min']:,.{digits}f}–{data['max']:,.{digits}f})"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
