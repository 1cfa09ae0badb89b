"""deepseek-llm's six llama.cpp split stages as one pattern whose matches are the pieces.

The stages (gguf_pre_tokenizers.DEEPSEEK_LLM_STAGES), each applied to every piece of the one
before: newlines alone; a run of cased letters with the one whitespace before it; a run of
"punctuation" (ASCII and fullwidth symbols, but also the ASCII and fullwidth letters, curly
quotes and U+3000-3002) with the one whitespace before it; a piece's trailing whitespace;
runs of the CJK-range class K (U+0800-9FA5, U+AC00-D7FF: most non-Latin scripts, curly
quotes and most Unicode spaces among them); runs of \\p{N}.

Taken together, with character classes (W: whitespace but no newline; U+3000 is both
whitespace and punctuation):
- stage 3 re-cuts a letter run into runs of ASCII-like letters and other letters, the
  whitespace staying with the first (a U+3000 before other letters goes alone);
- between letter runs, punctuation runs take one whitespace before them, and their trailing
  U+3000s (after the last other punctuation) are cut off by stage 4; a U+3000 just before a
  letter belongs to that letter run, not to the punctuation;
- the rest (other symbols, digits, scripts without case, whitespace) is cut before its
  trailing whitespace: whitespace in it stays only when something other follows in it;
- stages 5 and 6 cut wherever a character enters or leaves K or \\p{N} (they commute).
So every piece is one of the alternatives below, each class split by K membership. Checked
against the stage loop on random text over every class here (test_tok_gguf_pre_tokenizers).
"""

from __future__ import annotations

import array
import sys

import regex

Ranges = list[tuple[int, int]]
LAST_CODE_POINT = 0x10FFFF


def class_ranges(body: str) -> Ranges:
    """The code point ranges of a character class body of literal characters and `a-b`
    ranges (no escapes: the deepseek-llm stages use none), merged and sorted."""
    if "\\" in body:
        raise ValueError(f"class body with escapes is not supported: {body[:40]!r}")
    ranges, position = [], 0
    while position < len(body):
        if position + 2 < len(body) and body[position + 1] == "-":
            ranges.append((ord(body[position]), ord(body[position + 2])))
            position += 3
        else:
            ranges.append((ord(body[position]), ord(body[position])))
            position += 1
    return _merged(ranges)


def _merged(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for low, high in _merged(ranges):
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= LAST_CODE_POINT:
        out.append((start, LAST_CODE_POINT))
    return out


def intersection(first: Ranges, second: Ranges) -> Ranges:
    out = []
    for low, high in first:
        for other_low, other_high in second:
            if max(low, other_low) <= min(high, other_high):
                out.append((max(low, other_low), min(high, other_high)))
    return _merged(out)


def difference(first: Ranges, second: Ranges) -> Ranges:
    return intersection(first, complement(second))


def class_body(ranges: Ranges) -> str:
    """`ranges` written as a character class body with escapes only (read alike by `re`
    and `regex`)."""

    def char(code: int) -> str:
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    return "".join(
        char(low) if low == high else f"{char(low)}-{char(high)}" for low, high in ranges
    )


def property_ranges(escape: str) -> Ranges:
    """The code points `regex` matches with a class escape such as \\p{N} or \\s (its own
    Unicode tables, as the stage loop uses)."""
    every = array.array("I", range(LAST_CODE_POINT + 1)).tobytes()
    text = every.decode(f"utf-32-{sys.byteorder[0]}e", "surrogatepass")
    return [(match.start(), match.end() - 1) for match in regex.finditer(f"(?:{escape})+", text)]


def one_pattern(cased_body: str, punctuation_body: str, cjk_body: str) -> str:
    """One pattern for the stages, from the bodies of their letter (stage 2), punctuation
    (stage 3) and CJK-range (stage 5) classes. Every class is written out as code point
    ranges (\\s and \\p{N} from `regex`'s tables), so the standard `re` runs it too."""
    cased, punctuation, cjk = map(class_ranges, (cased_body, punctuation_body, cjk_body))
    whitespace, numeric = property_ranges("\\s"), property_ranges("\\p{N}")
    newline, ideographic_space = [(0x0A, 0x0A), (0x0D, 0x0D)], [(0x3000, 0x3000)]
    ascii_like = intersection(cased, punctuation)  # A-Za-z and their fullwidth forms
    other_cased = difference(cased, ascii_like)
    other_punctuation = difference(punctuation, ascii_like + ideographic_space)
    letter_or_punctuation = _merged(cased + other_punctuation)

    def cls(ranges: Ranges) -> str:
        return f"[{class_body(ranges)}]"

    def split_by_k(ranges: Ranges) -> dict[str, str]:
        return {"n": cls(difference(ranges, cjk)), "k": cls(intersection(ranges, cjk))}

    spaces = split_by_k(difference(whitespace, newline + ideographic_space))
    space = cls(difference(whitespace, newline + ideographic_space))
    # A U+3000 that belongs to punctuation: one not before a letter.
    ideographic = f"\\u3000(?!{cls(cased)})"
    other = cls(complement(whitespace + letter_or_punctuation))
    rest = split_by_k(complement(whitespace + letter_or_punctuation + numeric))
    cased_by_k, punct_by_k = split_by_k(other_cased), split_by_k(other_punctuation)
    digits = split_by_k(numeric)
    attaches = f"{cls(letter_or_punctuation)}|{ideographic}"
    alternatives = [
        "[\\r\\n]",
        f"{spaces['n']}?{cls(ascii_like)}+",
        *(f"{spaces[side]}?{cased_by_k[side]}+" for side in ("n", "k")),
        f"{spaces['n']}?{punct_by_k['n']}+",
        f"{spaces['k']}?(?:{punct_by_k['k']}|{ideographic})*"
        f"(?:{punct_by_k['k']}|{ideographic}(?={punct_by_k['n']}))",
        f"{spaces['k']}?(?:{ideographic})+",
        digits["k"] + "+",
        digits["n"] + "+",
        *(f"(?:{rest[side]}++|{spaces[side]}++(?={space}*+{other}))++" for side in ("n", "k")),
        *(f"(?:{spaces[side]}(?!{attaches}))+" for side in ("n", "k")),
        cls(difference(whitespace, newline)),
    ]
    return "|".join(alternatives)
