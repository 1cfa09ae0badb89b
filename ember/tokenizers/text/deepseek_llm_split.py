"""deepseek-llm's six llama.cpp split stages as one pattern whose matches are the pieces.

The stages (formats.gguf.pre_tokenizers.DEEPSEEK_LLM_STAGES), each applied to every piece of the one
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

from ember.tokenizers.text.char_classes import (
    Ranges,
    class_body,
    class_ranges,
    complement,
    difference,
    intersection,
    property_ranges,
    union,
)


def one_pattern(cased_body: str, punctuation_body: str, cjk_body: str) -> str:
    """One pattern for the stages, from the bodies of their letter (stage 2), punctuation
    (stage 3) and CJK-range (stage 5) classes. Every class is written out as code point
    ranges (\\s and \\p{N} from `regex`'s tables), so the standard `re` runs it too."""
    cased, punctuation, cjk = map(class_ranges, (cased_body, punctuation_body, cjk_body))
    whitespace, numeric = property_ranges("\\s", "\\p{N}")
    newline, ideographic_space = [(0x0A, 0x0A), (0x0D, 0x0D)], [(0x3000, 0x3000)]
    ascii_like = intersection(cased, punctuation)  # A-Za-z and their fullwidth forms
    other_cased = difference(cased, ascii_like)
    other_punctuation = difference(punctuation, ascii_like + ideographic_space)
    letter_or_punctuation = union(cased, other_punctuation)

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
