"""The meaning-preserving form of a prompt, for the semantic cache's second lookup.

Two prompts with the same canonical form ask the same question: the form forgets only what
never changes a question's meaning (letter case outside all-caps words, punctuation that ends or
separates clauses, whitespace, contractions, the article "the", politeness and greetings) and
keeps everything that can: every number exactly, every negation, every operator and symbol,
all-caps words as written (US, WHO, IT), and the order of every word. So "What is 12 plus 7?" and
"what is 12 plus 8" differ, "World War I" and "World War II" differ, Fahrenheit-to-Celsius and
Celsius-to-Fahrenheit differ, and a document with two different questions differs, while
"What's the capital of France?" and "what is the capital of france" are one question.

The rule misses paraphrases (different words for the same question): recall is traded for a
false-hit rate of zero on the labelled pairs (`ember/gateway/cache_pairs.json`).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# A number (3.14 one token; 1,000 two: a comma never joins digits), a word, or any other symbol.
_TOKEN = re.compile(r"\d+(?:\.\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?|[^\w\s]|_")
_CLAUSE_PUNCTUATION = frozenset(".,;:!?\"'`…")
_CONTRACTIONS = {"n't": ("not",), "'re": ("are",), "'m": ("am",), "'ll": ("will",), "'ve": ("have",), "'d": ("would",), "'s": ("is",)}
_IRREGULAR_NEGATIONS = {"can't": ("can", "not"), "won't": ("will", "not"), "shan't": ("shall", "not"), "ain't": ("is", "not")}
# Words whose absence never changes a question. Lower-case "a"/"an" only: "vitamin A" keeps its A.
_FILLER = frozenset({"the", "please", "kindly", "hi", "hello", "hey", "thanks"})
_LOWER_ARTICLES = frozenset({"a", "an"})


def canonical_form(text: str) -> str:
    """The canonical form of `text`: its meaningful tokens, in order, one space apart."""
    return " ".join(canonical_tokens(text))


def canonical_digest(text: str) -> str:
    """SHA-256 of the canonical form: the key of the cache's second lookup."""
    return hashlib.sha256(canonical_form(text).encode("utf-8")).hexdigest()


def canonical_tokens(text: str):
    """The tokens of the canonical form. A generator over `finditer`, so a long prompt is processed
    in small steps (a worker thread running it lets the event loop's thread take the GIL between)."""
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'").replace("\u2018", "'")
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0].isdigit():
            yield token
        elif token in _CLAUSE_PUNCTUATION:
            continue
        elif token.islower() and token.isalpha():  # the common case, without a call
            if token not in _FILLER and token not in _LOWER_ARTICLES:
                yield token
        elif token.isalpha() or "'" in token:
            yield from _words(token)
        else:
            yield token


def _words(token: str):
    """One word (maybe a contraction) as canonical words: case folded unless written all in
    capitals (an acronym), contractions spelled out, filler dropped."""
    if token in _LOWER_ARTICLES:
        return
    is_acronym = len(token) > 1 and token.isupper()
    word = token if is_acronym else token.lower()
    if word in _IRREGULAR_NEGATIONS:
        yield from _IRREGULAR_NEGATIONS[word]
        return
    stem, quote, ending = word.partition("'")
    if quote:
        suffix = "n't" if stem.endswith("n") and ending == "t" else "'" + ending
        stem = stem[:-1] if suffix == "n't" else stem
        yield from _words(stem) if stem else ()
        yield from _CONTRACTIONS.get(suffix, (ending,))
        return
    if word not in _FILLER:
        yield word
