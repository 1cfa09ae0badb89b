"""Regular expressions (the common subset of ECMA and Python syntax) as NFAs over characters, stepped one
character at a time, for JSON-schema `pattern` / `format` and vLLM's `guided_regex`.

Supported: literals, `.`, classes (`[a-z_]`, `[^"]`), `\\d \\w \\s` and their negations, escapes, groups
(capturing, `(?:...)`, named), alternation, `* + ?`, `{m}`, `{m,}`, `{m,n}` (lazy marks accepted), and
`^` / `$` at the pattern's ends. Back-references, look-arounds and `\\b` are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.engine.structured.errors import SchemaError

MAX_REPEAT = 256
MAX_STATES = 20_000
ANY = ((0, 0x10FFFF),)
CLASS_ESCAPES = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x09, 0x0D), (0x20, 0x20)),
}
CHARACTER_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
FORMATS = {
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "time": r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "date-time": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,8}",
    "ipv4": r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
    "hostname": r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,8}",
    "ipv6": ("([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}"
             "|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}"
             "|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}"
             "|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}|:((:[0-9a-fA-F]{1,4}){1,7}|:)"),
    # ISO 8601 durations as RFC 3339's appendix A writes them: years, months, days, then a time; or weeks (at most
    # 4 digits a field, so every one fits a timedelta).
    "duration": (r"P((\d{1,4}Y(\d{1,4}M(\d{1,4}D)?)?|\d{1,4}M(\d{1,4}D)?|\d{1,4}D)(T(\d{1,4}H(\d{1,4}M(\d{1,4}S)?)?|\d{1,4}M(\d{1,4}S)?|\d{1,4}S))?"
                 r"|T(\d{1,4}H(\d{1,4}M(\d{1,4}S)?)?|\d{1,4}M(\d{1,4}S)?|\d{1,4}S)|\d{1,4}W)"),
    "uri": r"[A-Za-z][A-Za-z0-9+.-]{0,15}://[A-Za-z0-9._~%!$&'()*+,;=:@-]{1,253}(/[A-Za-z0-9._~%!$&'()*+,;=:@/-]{0,200})?(\?[^\s#]{0,200})?(#[^\s]{0,100})?",
}


@dataclass(frozen=True)
class CharSet:
    """Code point ranges, or everything outside them when `negated`."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def matches(self, code: int) -> bool:
        return any(low <= code <= high for low, high in self.ranges) != self.negated

    def meets(self, first: int, last: int) -> bool:
        """Whether some code point from `first` to `last` matches."""
        if first > last:
            return False
        if not self.negated:
            return any(low <= last and first <= high for low, high in self.ranges)
        uncovered = first  # the lowest code point of the span not yet inside a range
        for low, high in sorted(self.ranges):
            if low > uncovered:
                break
            uncovered = max(uncovered, high + 1)
        return uncovered <= last


@dataclass(frozen=True)
class Nfa:
    """States 0..n-1; `edges[s]` are (CharSet, target) pairs, `empty[s]` the targets reached reading nothing."""

    edges: tuple[tuple[tuple[CharSet, int], ...], ...]
    empty: tuple[tuple[int, ...], ...]
    start: int
    accept: int

    def initial(self) -> frozenset[int]:
        return self._closure({self.start})

    def step(self, states: frozenset[int], character: str) -> frozenset[int]:
        code = ord(character)
        return self._closure({target for s in states for chars, target in self.edges[s] if chars.matches(code)})

    def step_any(self, states: frozenset[int], first: int, last: int) -> frozenset[int]:
        """The states some character from code point `first` to `last` leads to (a character still being read)."""
        return self._closure({target for s in states for chars, target in self.edges[s] if chars.meets(first, last)})

    def accepts(self, states: frozenset[int]) -> bool:
        return self.accept in states

    def is_dead_end(self, states: frozenset[int]) -> bool:
        """Whether no character can follow (the match can only end here)."""
        return not any(self.edges[s] for s in states)

    def remaining_lengths(self, cap: int) -> tuple[int, ...]:
        """Per state, a bit mask of how many more characters can take it to the accept state: bit l for l < cap,
        bit `cap` for any number from `cap` on. A fixed point over the edges taken backwards."""
        everything = (1 << (cap + 1)) - 1
        predecessors: list[list[tuple[int, bool]]] = [[] for _ in self.edges]
        for state, (edges, empty) in enumerate(zip(self.edges, self.empty, strict=True)):
            for _, target in edges:
                predecessors[target].append((state, True))
            for target in empty:
                predecessors[target].append((state, False))
        masks = [0] * len(self.edges)
        masks[self.accept] = 1
        pending = [self.accept]
        while pending:
            target = pending.pop()
            for state, reads in predecessors[target]:
                shifted = masks[target] << 1 if reads else masks[target]
                grown = masks[state] | (shifted & everything) | (1 << cap if shifted >> cap else 0)
                if grown != masks[state]:
                    masks[state] = grown
                    pending.append(state)
        return tuple(masks)

    def _closure(self, states: set[int]) -> frozenset[int]:
        pending = list(states)
        while pending:
            for target in self.empty[pending.pop()]:
                if target not in states:
                    states.add(target)
                    pending.append(target)
        return frozenset(states)


def compile_regex(pattern: str, search: bool = False) -> Nfa:
    """The NFA of `pattern` matching a whole text; `search`: anywhere in it, as JSON schema's `pattern`
    does (unless anchored with `^` / `$`)."""
    if not isinstance(pattern, str):
        raise SchemaError(f"a regular expression is a string, not {type(pattern).__name__}")
    anchored_start, anchored_end = pattern.startswith("^"), pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[1 if anchored_start else 0 : len(pattern) - 1 if anchored_end else len(pattern)]
    tree = _Parser(body).parse()
    if search and not anchored_start:
        tree = ("seq", [("repeat", ("chars", CharSet(ANY)), 0, None), tree])
    if search and not anchored_end:
        tree = ("seq", [tree, ("repeat", ("chars", CharSet(ANY)), 0, None)])
    return _Builder().build(tree)


def format_regex(name: str) -> str:
    if name not in FORMATS:
        raise SchemaError(f"format {name!r} is not enforced by ember; use one of {sorted(FORMATS)} or remove it")
    return FORMATS[name]


class _Parser:
    """Pattern text to a tree: ("chars", CharSet), ("seq", [..]), ("alt", [..]), ("repeat", tree, min, max|None)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0

    def parse(self):
        tree = self._alternation()
        if self.at != len(self.text):
            self._fail(f"unexpected {self.text[self.at]!r}")
        return tree

    def _fail(self, what: str):
        raise SchemaError(f"regular expression {self.text!r}: {what} at position {self.at}")

    def _peek(self) -> str | None:
        return self.text[self.at] if self.at < len(self.text) else None

    def _alternation(self):
        options = [self._sequence()]
        while self._peek() == "|":
            self.at += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def _sequence(self):
        items = []
        while self._peek() not in (None, "|", ")"):
            items.append(self._quantified(self._atom()))
        return ("seq", items)

    def _quantified(self, atom):
        char = self._peek()
        if char in ("*", "+", "?"):
            self.at += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{" and self._is_counted():
            low, high = self._counts()
        else:
            return atom
        if self._peek() == "?":
            self.at += 1  # lazy or greedy: the same set of texts
        if self._peek() in ("*", "+", "?", "{"):
            self._fail("a quantifier after a quantifier")
        return ("repeat", atom, low, high)

    def _is_counted(self) -> bool:
        end = self.text.find("}", self.at)
        inside = self.text[self.at + 1 : end] if end > 0 else ""
        return bool(inside) and all(c.isdigit() or c == "," for c in inside) and inside[0].isdigit() and inside.count(",") <= 1

    def _counts(self) -> tuple[int, int | None]:
        end = self.text.index("}", self.at)
        low_text, comma, high_text = self.text[self.at + 1 : end].partition(",")
        self.at = end + 1
        low = int(low_text)
        high = (int(high_text) if high_text else None) if comma else low
        if low > MAX_REPEAT or (high is not None and (high > MAX_REPEAT or high < low)):
            self._fail(f"a repeat count above {MAX_REPEAT} or below its minimum")
        return low, high

    def _atom(self):
        char = self.text[self.at]
        self.at += 1
        if char == "(":
            return self._group()
        if char == "[":
            return ("chars", self._class())
        if char == ".":
            return ("chars", CharSet(((0x0A, 0x0A),), negated=True))  # anything but a line break
        if char == "\\":
            return ("chars", self._escape(in_class=False))
        if char in "^$":
            self._fail("an anchor inside the pattern (only at its start and end)")
        if char in "*+?{":
            self._fail(f"nothing to repeat before {char!r}")
        return ("chars", CharSet(((ord(char), ord(char)),)))

    def _group(self):
        if self.text.startswith("?:", self.at):
            self.at += 2
        elif self.text.startswith("?P<", self.at) or (self.text.startswith("?<", self.at) and self.text[self.at + 2 : self.at + 3] not in ("=", "!")):
            self.at = self.text.index(">", self.at) + 1
        elif self._peek() == "?":
            self._fail("look-arounds and inline flags are not supported")
        tree = self._alternation()
        if self._peek() != ")":
            self._fail("an unclosed group")
        self.at += 1
        return tree

    def _class(self) -> CharSet:
        negated = self._peek() == "^"
        self.at += negated
        ranges: list[tuple[int, int]] = []
        first = True
        while self._peek() is not None and (self._peek() != "]" or first):
            first = False
            low = self._class_member(ranges)
            if low is None:
                continue
            if self._peek() == "-" and self.text[self.at + 1 : self.at + 2] not in ("]", ""):
                self.at += 1
                high = self._class_member(ranges)
                if high is None or high < low:
                    self._fail("a bad range in a class")
                ranges.append((low, high))
            else:
                ranges.append((low, low))
        if self._peek() != "]":
            self._fail("an unclosed class")
        self.at += 1
        return CharSet(tuple(ranges), negated)

    def _class_member(self, ranges: list[tuple[int, int]]) -> int | None:
        """One character of a class (its code), or None after adding a class escape's ranges."""
        char = self.text[self.at]
        self.at += 1
        if char != "\\":
            return ord(char)
        escaped = self._escape(in_class=True)
        if escaped.negated:
            self._fail("a negated class escape (\\D, \\W, \\S) inside a class")
        if len(escaped.ranges) == 1 and escaped.ranges[0][0] == escaped.ranges[0][1]:
            return escaped.ranges[0][0]
        ranges.extend(escaped.ranges)
        return None

    def _escape(self, in_class: bool) -> CharSet:
        if self._peek() is None:
            self._fail("a trailing backslash")
        char = self.text[self.at]
        self.at += 1
        if char.lower() in CLASS_ESCAPES:
            return CharSet(CLASS_ESCAPES[char.lower()], negated=char.isupper())
        if char in CHARACTER_ESCAPES:
            code = ord(CHARACTER_ESCAPES[char])
        elif char == "u" and len(self.text) >= self.at + 4:
            code = int(self.text[self.at : self.at + 4], 16)
            self.at += 4
        elif char.isalnum():
            self._fail(f"the escape \\{char} (back-references and \\b are not supported)")
        else:
            code = ord(char)
        return CharSet(((code, code),))


class _Builder:
    """A tree to a Thompson NFA."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[CharSet, int]]] = []
        self.empty: list[list[int]] = []

    def build(self, tree) -> Nfa:
        start, accept = self._fragment(tree)
        return Nfa(tuple(map(tuple, self.edges)), tuple(map(tuple, self.empty)), start, accept)

    def _state(self) -> int:
        if len(self.edges) >= MAX_STATES:
            raise SchemaError(f"the regular expression needs more than {MAX_STATES} states; simplify it")
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1

    def _fragment(self, tree) -> tuple[int, int]:
        kind = tree[0]
        start, end = self._state(), self._state()
        if kind == "chars":
            self.edges[start].append((tree[1], end))
        elif kind == "seq":
            at = start
            for item in tree[1]:
                first, last = self._fragment(item)
                self.empty[at].append(first)
                at = last
            self.empty[at].append(end)
        elif kind == "alt":
            for option in tree[1]:
                first, last = self._fragment(option)
                self.empty[start].append(first)
                self.empty[last].append(end)
        else:
            self._repeat(tree[1], tree[2], tree[3], start, end)
        return start, end

    def _repeat(self, item, low: int, high: int | None, start: int, end: int) -> None:
        at = start
        for _ in range(low):
            first, last = self._fragment(item)
            self.empty[at].append(first)
            at = last
        if high is None:
            first, last = self._fragment(item)
            self.empty[at] += [first, end]
            self.empty[last] += [first, end]
            return
        for _ in range(high - low):
            first, last = self._fragment(item)
            self.empty[at] += [first, end]
            at = last
        self.empty[at].append(end)
