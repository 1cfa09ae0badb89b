"""The three structured-output backends (ember's own engine, xgrammar, llguidance) against each other, on SmolLM2's
real 49,152-token vocabulary: given a random constraint, when a random allowed token sequence is walked through it,
then at every step each backend allows exactly the same set of next tokens (EOS included), save one documented
difference: where the grammar forces text, llguidance allows only the tokenizer's own split of it (its canonical
forced tokenization, guidance-ai/guidance#1352), so a token spelling another split of the same text (one of the two
a prefix of the other) may be missing from its set, and nothing else.

The random inputs keep to where the engines' documented semantics meet: llguidance lexes a grammar's terminals
greedily (Lark's rule: adjacent terminals take the longest match) where xgrammar is scannerless, so every random
terminal ends in ";" (no terminal runs into the next); length-bounded JSON strings take no escapes in the libraries
(ember counts an escape as one character), and ember reads "-0" as an integer >= 0; so the random schemas' strings
are unbounded and their integers start at 1. llguidance also refuses DEL (0x7F) inside a JSON string, which JSON
allows (ember and xgrammar allow it): the one token spelling it is left out of the comparison with llguidance.

Regular expressions and JSON schemas go through all three; a grammar (which ember's engine refuses, by name) through
xgrammar and llguidance, written as GBNF and read by each library's own parser. JSON is compared compact (ember's
pretty-printing blanks and the libraries' free whitespace are different choices, not disagreements).
"""

from __future__ import annotations

import random

import pytest
import torch

from ember.engine.structured import SchemaError, StructuredOutput
from ember.engine.structured.library_backends import vocabulary_bytes
from ember.engine.structured.structured_outputs import StructuredOutputs

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")

VOCAB_SIZE = 49152
WALK_STEPS = 16
ALL_BACKENDS = ("ember", "xgrammar", "llguidance")
GRAMMAR_BACKENDS = ("xgrammar", "llguidance")


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from ember.tokenizers import load

    return load(str(smollm2_gguf))


@pytest.fixture(scope="module")
def backends(tokenizer):
    return {name: StructuredOutputs(tokenizer, VOCAB_SIZE, name) for name in ALL_BACKENDS}


@pytest.fixture(scope="module")
def token_bytes(tokenizer):
    return vocabulary_bytes(tokenizer, VOCAB_SIZE)


def _allowed(guide) -> frozenset[int]:
    logits = torch.zeros(VOCAB_SIZE)
    guide.hold(logits, is_greedy=False)
    return frozenset(torch.isfinite(logits).nonzero().flatten().tolist())


def _assert_agree(allowed: dict[str, frozenset[int]], constraint: StructuredOutput, path: list[int], token_bytes: list[bytes]) -> None:
    """Every backend allows the reference's set (the first not llguidance); llguidance may leave out only tokens that
    are a proper prefix of a token it allows (its canonical tokenization of forced text)."""
    names = list(allowed)
    reference = next(name for name in names if name != "llguidance")
    expected = allowed[reference]
    for name in names:
        got = allowed[name]
        missing, extra = sorted(expected - got), sorted(got - expected)
        if name == "llguidance":
            missing = [t for t in missing if b"\x7f" not in token_bytes[t]  # DEL: JSON allows it in a string, llguidance not
                       and not any(token_bytes[u].startswith(token_bytes[t]) or token_bytes[t].startswith(token_bytes[u]) for u in got)]
        assert not missing and not extra, f"{name} vs {reference} on {constraint} after {path}: only {name}: {extra[:10]}, only {reference}: {missing[:10]}"


def _walk(backends: dict, names: tuple[str, ...], constraint: StructuredOutput, seed: int, token_bytes: list[bytes]) -> list[int]:
    """Walk a random path every backend allows, asserting they agree on the next tokens at each step."""
    guides = {name: backends[name].guide(constraint) for name in names}
    eos_ids = {0, 2}
    rng = random.Random(seed)
    path: list[int] = []
    for _ in range(WALK_STEPS):
        allowed = {name: _allowed(guide) for name, guide in guides.items()}
        _assert_agree(allowed, constraint, path, token_bytes)
        common = frozenset.intersection(*allowed.values())
        choices = sorted(common - eos_ids)
        if not choices or (common & eos_ids and rng.random() < 0.25):
            break
        token_id = rng.choice(choices)
        path.append(token_id)
        for guide in guides.values():
            guide.advance(token_id)
    return path


# A random regular language as an expression tree: rendered as a regular expression and as a GBNF grammar.
LITERALS = ["a", "b", "ab", "cd", "x", "1", "22", " ", "-"]
CLASSES = ["[a-c]", "[0-9]", "[xyz]"]


def _tree(rng: random.Random, depth: int = 0, under_repeat: bool = False):
    if depth >= 2 or rng.random() < 0.3:
        return ("literal", rng.choice(LITERALS)) if rng.random() < 0.6 else ("class", rng.choice(CLASSES))
    kind = rng.choice(["concat", "either"] if under_repeat else ["concat", "either", "?", "*", "+"])
    if kind in ("concat", "either"):
        return (kind, [_tree(rng, depth + 1) for _ in range(rng.randint(2, 3))])
    return (kind, _tree(rng, depth + 1, under_repeat=True))  # (x+)? is x*: llguidance's GBNF reader refuses the former


def _regex(tree) -> str:
    kind, body = tree
    if kind in ("literal", "class"):
        return body
    if kind == "concat":
        return "".join(f"({_regex(part)})" for part in body)
    if kind == "either":
        return "|".join(f"({_regex(part)})" for part in body)
    return f"({_regex(body)}){kind}"


def _gbnf(tree) -> str:
    """The tree as GBNF whose every terminal ends in ";" (see the module's note on lexing)."""
    kind, body = tree
    if kind == "literal":
        return f'"{body};"'
    if kind == "class":
        return f'{body} ";"'
    if kind == "concat":
        return " ".join(f"({_gbnf(part)})" for part in body)
    if kind == "either":
        return " | ".join(f"({_gbnf(part)})" for part in body)
    return f"({_gbnf(body)}){kind}"


def _schema(rng: random.Random, depth: int = 0) -> dict:
    if depth >= 2 or rng.random() < 0.4:
        return rng.choice([
            {"type": "boolean"}, {"type": "null"}, {"type": "integer", "minimum": 1, "maximum": 99},
            {"type": "string"}, {"enum": rng.sample(["red", "green", "blue", "a b", 'q"uote'], rng.randint(1, 3))},
        ])  # fmt: skip
    if rng.random() < 0.3:
        return {"type": "array", "items": _schema(rng, depth + 1), "maxItems": 2}
    names = rng.sample(["id", "name", "ok", "tags"], rng.randint(1, 3))
    return {"type": "object", "properties": {name: _schema(rng, depth + 1) for name in names}, "required": names,
            "additionalProperties": False}  # fmt: skip


SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_three_backends_allow_the_same_tokens_under_a_random_regex(backends, token_bytes, seed):
    _walk(backends, ALL_BACKENDS, StructuredOutput(regex=_regex(_tree(random.Random(seed)))), seed, token_bytes)


@pytest.mark.parametrize("seed", SEEDS)
def test_xgrammar_and_llguidance_allow_the_same_tokens_under_a_random_grammar(backends, token_bytes, seed):
    grammar = f"root ::= item item\nitem ::= {_gbnf(_tree(random.Random(seed)))}"
    _walk(backends, GRAMMAR_BACKENDS, StructuredOutput(grammar=grammar), seed, token_bytes)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_three_backends_allow_the_same_tokens_under_a_random_schema(backends, token_bytes, seed):
    schema = _schema(random.Random(seed))
    _walk(backends, ALL_BACKENDS, StructuredOutput(json_schema=schema, compact_whitespace=True), seed, token_bytes)


def test_a_grammar_given_as_lark_is_read_the_same_as_its_gbnf(backends, token_bytes):
    gbnf = StructuredOutput(grammar='root ::= "id-" [0-9] [0-9]? ("," " "? "ok")*')
    lark = StructuredOutput(grammar='start: "id-" /[0-9]/ /[0-9]/? ("," " "? "ok")*')
    for seed in range(3):
        path = _walk(backends, GRAMMAR_BACKENDS, gbnf, seed, token_bytes)
        for name in GRAMMAR_BACKENDS:
            guide = backends[name].guide(lark)
            for token_id in path:
                assert token_id in _allowed(guide), (name, path)
                guide.advance(token_id)


def test_ember_refuses_a_grammar_by_name_and_auto_sends_it_to_a_grammar_backend(smollm2_gguf):
    from ember.tokenizers import load

    grammar = StructuredOutput(grammar='root ::= "yes" | "no"')
    with pytest.raises(SchemaError, match="does not read grammars.*--structured-outputs-backend"):
        StructuredOutputs(load(str(smollm2_gguf)), VOCAB_SIZE, "ember").guide(grammar)
    guide = StructuredOutputs(load(str(smollm2_gguf)), VOCAB_SIZE, "auto").guide(grammar)
    assert type(guide).__name__ == "LLGuidanceGuide"


@pytest.mark.parametrize("text", ['root ::= "a', "start: undefined_rule", "hello world", "   "])
def test_a_malformed_grammar_is_refused_on_construction_with_the_parsers_message(text):
    with pytest.raises(SchemaError, match="grammar"):
        StructuredOutput(grammar=text)


@pytest.mark.parametrize("name", GRAMMAR_BACKENDS)
def test_forced_tokens_spell_the_only_way_forward_and_stop_before_a_choice(backends, name, smollm2_gguf):
    from ember.tokenizers import load

    tokenizer = load(str(smollm2_gguf))
    guide = backends[name].guide(StructuredOutput(grammar='root ::= "{\\"name\\": \\"" ("Bob" | "Alice") "\\"}"'))
    text = ""
    while forced := guide.forced_tokens():
        text += tokenizer.decode(forced)
        for token_id in forced:
            guide.advance(token_id)
    # xgrammar leaves out a last forced token that a longer one extends (' "' before 'Bob'); the model samples it
    assert text.startswith('{"name":') and '{"name": "'.startswith(text), text
    assert not guide.is_finished
