"""deepseek-v3's three llama.cpp split stages as one pattern whose matches are the pieces.

The stages (gguf_pre_tokenizers.DEEPSEEK_V3_STAGES): numerals in groups of up to three from
the left of each run; runs of CJK ideographs and kana (J); then a Llama-3-like word pattern
inside every piece left. Digit groups and J runs never hold a character of the other, so the
third stage sees three kinds of piece: a digit group (where it matches nothing), a J run
(where only its letter, symbol and "other" alternatives can apply) and the text between them
(a segment). Inside a segment the word pattern applies as it is, with each class losing the
digits and J, and its `\\s+(?!\\S)` ending where the segment does: before a digit or J as at
the end. What no alternative takes (unassigned, format and control characters not before a
letter) is a piece of its own, as between the stage's matches. Checked against the stage loop
on random text over every class here (test_tok_gguf_pre_tokenizers).
"""

from __future__ import annotations

from ember.tokenizers.char_classes import (
    Ranges,
    class_body,
    class_ranges,
    complement,
    difference,
    intersection,
    property_ranges,
    union,
)

NEWLINES = [(0x0A, 0x0A), (0x0D, 0x0D)]
# The word stage's first alternative: one ASCII punctuation mark before ASCII letters.
ASCII_PUNCTUATION = class_ranges("!-/:-@[-`{-~")
ASCII_LETTERS = class_ranges("A-Za-z")


def one_pattern(cjk_kana_body: str) -> str:
    """One pattern for the stages, from the body of the CJK/kana stage's class."""
    cjk_kana = class_ranges(cjk_kana_body)
    letters, marks, punctuation, symbols, numerals, whitespace = property_ranges(
        "\\p{L}", "\\p{M}", "\\p{P}", "\\p{S}", "\\p{N}", "\\s"
    )
    word = union(letters, marks)
    marks_and_symbols = union(punctuation, symbols)
    # What the word stage's optional first character may be (no newline, letter, punctuation
    # or symbol), and what no alternative of it starts with.
    lead = complement(union(NEWLINES, letters, punctuation, symbols))
    other = complement(union(word, marks_and_symbols, numerals, whitespace))

    def cls(ranges: Ranges) -> str:
        return f"[{class_body(ranges)}]"

    def outside(ranges: Ranges) -> str:  # in a segment: no numeral, no CJK or kana
        return cls(difference(ranges, union(numerals, cjk_kana)))

    def inside(ranges: Ranges) -> str:  # in a CJK/kana run
        return cls(intersection(ranges, cjk_kana))

    segment_end = f"(?!{cls(complement(union(whitespace, numerals, cjk_kana)))})"
    return "|".join(
        [
            f"{cls(numerals)}{{1,3}}",
            f"{inside(lead)}?{inside(word)}+",
            f"{inside(marks_and_symbols)}+",
            f"(?:{inside(other)}(?!{inside(word)}))+",
            f"{cls(ASCII_PUNCTUATION)}{cls(ASCII_LETTERS)}+",
            f"{outside(lead)}?{outside(word)}+",
            f" ?{outside(marks_and_symbols)}+[\\r\\n]*",
            f"{cls(whitespace)}*[\\r\\n]+",
            f"{cls(whitespace)}+{segment_end}",
            f"{cls(whitespace)}+",
            f"(?:{outside(other)}(?!{outside(word)}))+",
        ]
    )
