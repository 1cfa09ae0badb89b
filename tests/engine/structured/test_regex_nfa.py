"""Regular expressions as NFAs against Python's `re` (ASCII classes, as ECMA-262 has them) on generated texts."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.engine.structured import SchemaError
from ember.engine.structured.regex_nfa import FORMATS, compile_regex

PATTERNS = [r"[A-Z][a-z]+", r"(ab|a)*c?", r"\d{3}-\d{2,4}", r"x{0,3}y+", r"[^abc]+\.", r"(?:foo|bar)+", r"a.c", r"[\w.-]+@[a-z]+",
            r"colou?r", r"\u00e9|e", r"[-+]?\d+(\.\d*)?", r"(?P<year>\d{2})x", r"[\s\d]*z", *FORMATS.values()]  # fmt: skip
ALPHABET = "abcxyrABZ0129-.+:@TZ_é \n"


def full_match(pattern: str, text: str) -> bool:
    nfa = compile_regex(pattern)
    states = nfa.initial()
    for character in text:
        states = nfa.step(states, character)
    return nfa.accepts(states)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(PATTERNS), st.lists(st.text(alphabet=ALPHABET, max_size=14), min_size=20, max_size=20))
def test_whole_match_agrees_with_python_re(pattern, texts):
    reference = re.compile(pattern, re.ASCII)
    for text in texts:
        assert full_match(pattern, text) == bool(reference.fullmatch(text)), (pattern, text)


@pytest.mark.parametrize(("name", "good", "bad"), [
    ("date", "2024-02-29", "2024-13-01"), ("time", "23:59:59Z", "24:00:00Z"),
    ("date-time", "2024-01-01T10:00:00.5+02:00", "2024-01-01 10:00:00"), ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567"),
    ("email", "ada.l@math.example.org", "ada@localhost"), ("ipv4", "192.168.0.1", "256.1.1.1"),
    ("hostname", "api.example-1.com", "-bad.example"), ("uri", "https://example.org/a/b?q=1#top", "example.org/a"),
])  # fmt: skip
def test_formats_match_what_they_name(name, good, bad):
    assert full_match(FORMATS[name], good) and not full_match(FORMATS[name], bad)


def test_a_search_pattern_matches_anywhere_unless_anchored():
    def searched(pattern: str, text: str) -> bool:
        nfa = compile_regex(pattern, search=True)
        states = nfa.initial()
        for character in text:
            states = nfa.step(states, character)
        return nfa.accepts(states)

    assert searched("b+", "abbc") and not searched("^b+", "abbc") and not searched("b+$", "abbc") and searched("^a.*c$", "abbc")


@pytest.mark.parametrize("pattern", [r"(a", r"[a-", r"a{3,1}", r"**", r"a|^b", r"\b", r"a{999}"])
def test_a_pattern_ember_cannot_take_is_refused(pattern):
    with pytest.raises(SchemaError):
        compile_regex(pattern)
