"""Bounds a schema puts on a value as it is written: string lengths in characters, number ranges.

A number is checked digit by digit: a prefix is allowed while some way of finishing it lands inside the
range (`number_reachable`), and it may end only with its own value inside (`number_within`). A bounded
number is written in decimal notation (no exponent) with at most `MAX_BOUNDED_DIGITS` integer digits, so
the values a prefix can still reach are a few intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

MAX_BOUNDED_DIGITS = 18


@dataclass(frozen=True)
class Bound:
    """One end of a number range: its value, and whether the value itself is excluded."""

    value: Fraction
    exclusive: bool = False


def counts_as_character(byte: int) -> bool:
    """Whether a UTF-8 byte starts a character (continuation bytes 0x80-0xBF do not)."""
    return not 0x80 <= byte <= 0xBF


def number_within(text: str, is_integer: bool, lower: Bound | None, upper: Bound | None, multiple_of: Fraction | None = None) -> bool:
    """Whether the finished number `text` lies inside the bounds (and is a multiple of `multiple_of`)."""
    low, high = _range(is_integer, lower, upper)
    value = Fraction(text)
    if multiple_of is not None and value % multiple_of:
        return False
    return low <= value <= high if is_integer else _inside(value, lower, upper)


def number_reachable(text: str, is_integer: bool, lower: Bound | None, upper: Bound | None, multiple_of: Fraction | None = None) -> bool:
    """Whether some number that starts with `text` ("-", "12", "-0.5", "3.") lies inside the bounds (and is a
    multiple of `multiple_of`: a decimal step, so its multiples are all written in finitely many digits)."""
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    whole, dot, fraction = digits.partition(".")
    if len(whole) > MAX_BOUNDED_DIGITS:
        return False
    for start, end in _magnitudes(whole, dot, fraction, is_integer):  # [start, end) of |value|
        span = (-end, -start) if negative else (start, end)  # the open end is the one away from zero
        if _meets(span, negative, is_integer, lower, upper, multiple_of):
            return True
    return False


def _magnitudes(whole: str, dot: str, fraction: str, is_integer: bool) -> list[tuple[Fraction, Fraction]]:
    """The |value| ranges [start, end) that finishing the digits can reach."""
    if not whole:
        return [(Fraction(0), Fraction(10**MAX_BOUNDED_DIGITS))]
    number = int(whole)
    if dot:
        step = Fraction(1, 10 ** len(fraction))
        start = number + Fraction(int(fraction or "0")) * step
        return [(start, start + step)]
    spans = [(Fraction(number), Fraction(number + 1))]  # this integer, or with a fraction after it
    if whole != "0":
        spans += [(Fraction(number * 10**k), Fraction((number + 1) * 10**k)) for k in range(1, MAX_BOUNDED_DIGITS - len(whole) + 1)]
    return spans


def _meets(span: tuple[Fraction, Fraction], negative: bool, is_integer: bool, lower: Bound | None, upper: Bound | None,
           step: Fraction | None) -> bool:
    """Whether the bounds hold some value of `span` (open at its end away from zero), a multiple of `step` if given."""
    start, end = span
    if is_integer:  # integers of (start, end] or [start, end), within the bounds
        low, high = _range(True, lower, upper)
        first, last = max(start + 1 if negative else start, low), min(end if negative else end - 1, high)
        # the integers among the multiples of p/q (lowest terms) are the multiples of p
        return first <= last if step is None else _has_multiple(first, False, last, False, Fraction(step.numerator))
    low_end = (start, negative)  # (value, open): [start, end) above zero, (start, end] below
    high_end = (end, not negative)
    if lower is not None and (lower.value, lower.exclusive) > low_end:
        low_end = (lower.value, lower.exclusive)
    if upper is not None and (upper.value, not upper.exclusive) < (high_end[0], not high_end[1]):
        high_end = (upper.value, upper.exclusive)
    if step is None:
        return low_end[0] < high_end[0] or (low_end[0] == high_end[0] and not low_end[1] and not high_end[1])
    return _has_multiple(low_end[0], low_end[1], high_end[0], high_end[1], step)


def _has_multiple(low: Fraction, low_open: bool, high: Fraction, high_open: bool, step: Fraction) -> bool:
    """Whether a multiple of `step` lies between `low` and `high` (each end excluded when open)."""
    k = math.ceil(Fraction(low) / step)
    if low_open and k * step == low:
        k += 1
    value = k * step
    return value < high or (value == high and not high_open)


def _inside(value: Fraction, lower: Bound | None, upper: Bound | None) -> bool:
    if lower is not None and (value < lower.value or (lower.exclusive and value == lower.value)):
        return False
    return upper is None or not (value > upper.value or (upper.exclusive and value == upper.value))


def _range(is_integer: bool, lower: Bound | None, upper: Bound | None) -> tuple[float | int, float | int]:
    """The integers allowed, as [low, high] (infinite where unbounded)."""
    low: float | int = -math.inf
    high: float | int = math.inf
    if lower is not None:
        low = math.floor(lower.value) + 1 if lower.exclusive else math.ceil(lower.value)
    if upper is not None:
        high = math.ceil(upper.value) - 1 if upper.exclusive else math.floor(upper.value)
    return low, high
