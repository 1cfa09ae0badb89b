"""Byte-at-a-time recognition of JSON text conforming to a compiled schema, as immutable states.

A state is `(stack, whitespace_run, broke_line)`. The stack holds frames (tuples, top last): a value still to
start (`V`), an object walking its schema's properties in order (`O`), an object of any keys (`P`, its
values of one node),
an array (`A`), a string's body (`S`; `Q` when a pattern or format matches its characters), a literal
being spelled (`L`), a number (`N`), raw text a regular expression matches (`R`). `step` returns
every state a byte can lead to: more than one where `anyOf` alternatives or literals that prefix
each other are still open, none where the byte is not allowed. The empty stack is a finished value.
A root of fixed texts (a list of choices) reads the raw bytes of one of them, blanks included.

Whitespace is allowed between tokens where pretty-printed JSON has it: not between a key and its
colon, and after a value only from a line break on (the one before a closing bracket); at most
`MAX_WHITESPACE_RUN` bytes (or none: compact JSON) and one line break in a row. A small model would otherwise spend its
tokens on blanks between every two tokens. A number ends at the first byte that cannot
continue it, which is then read by the enclosing frame.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction

from ember.engine.structured.json_bounds import counts_as_character, number_reachable, number_within
from ember.engine.structured.json_schema import ANY, ROOT, CompiledSchema, Node

MAX_WHITESPACE_RUN = 20
WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
MAX_CODE_POINT = 0x10FFFF


def _utf8_leads() -> dict[int, tuple]:
    """A string body's phase after each lead byte of a multi-byte character: how many continuation bytes follow and the
    range the first of them may take (narrower after E0, ED, F0 and F4: no overlong forms, surrogates or code points past
    U+10FFFF, as Python's decoder requires)."""
    leads = {byte: ("utf8", 1, 0x80, 0xBF) for byte in range(0xC2, 0xE0)}
    leads |= {byte: ("utf8", 2, 0x80, 0xBF) for byte in range(0xE1, 0xF0)}
    leads |= {byte: ("utf8", 3, 0x80, 0xBF) for byte in range(0xF1, 0xF4)}
    leads |= {0xE0: ("utf8", 2, 0xA0, 0xBF), 0xED: ("utf8", 2, 0x80, 0x9F), 0xF0: ("utf8", 3, 0x90, 0xBF), 0xF4: ("utf8", 3, 0x80, 0x8F)}
    return leads


UTF8_LEADS = _utf8_leads()
JSON_ESCAPES = {ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b", ord("f"): "\f", ord("n"): "\n", ord("r"): "\r",
                ord("t"): "\t"}  # fmt: skip
NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp"})  # phases in which a number is complete
KEY_PHASES = ("open", "key")  # an object expecting a key (after '{' or after ',')
ANY_ARRAY = -1  # the items node of an array inside an unconstrained value: any value

State = tuple[tuple, int, bool]
GAP, LINE_FIRST = "gap", "line first"  # whitespace allowed here; allowed only from a line break on
# A string frame is ("S", phase, node, characters so far) and a number frame ("N", is_integer, phase, node,
# text so far); both carry their node (and count or text) only when it bounds them, so unbounded strings and
# numbers share their states.
STRING_BODY = ("S", "body", None, 0)
# A string's body between characters: "high" right after a high surrogate's \u escape (a counted string's next
# escape may be its low half, which does not count again).
BODY_PHASES = ("body", "high")


class JsonRecognizer:
    """Steps states of one compiled schema; the root value is node 0 of the schema's table."""

    def __init__(self, schema: CompiledSchema, max_whitespace_run: int = MAX_WHITESPACE_RUN) -> None:
        """`max_whitespace_run` 0: compact JSON, no whitespace between its tokens (vLLM's disable_any_whitespace)."""
        self.nodes = schema.nodes
        self.max_whitespace_run = max_whitespace_run
        self.initial: frozenset[State] = frozenset({((("V", ROOT),), 0, None)})

    def step(self, states: frozenset[State], byte: int) -> frozenset[State]:
        """Every state reachable from one of `states` by reading `byte`."""
        found = set()
        is_line_break = byte == ord("\n")
        for stack, run, broke_line in states:
            for next_stack, whitespace in self._step(stack, byte):
                if whitespace is None:
                    found.add((next_stack, 0, None))
                elif run < self.max_whitespace_run and not (broke_line and is_line_break) and (run or is_line_break or whitespace == GAP):
                    found.add((next_stack, run + 1, broke_line or is_line_break))
        return frozenset(found)

    def read(self, states: frozenset[State], data: bytes) -> frozenset[State]:
        """The states after reading all of `data` (empty from the first byte refused on)."""
        for byte in data:
            if not states:
                break
            states = self.step(states, byte)
        return states

    @staticmethod
    def is_complete(states: frozenset[State]) -> bool:
        """Whether every state has finished the value, so nothing more may follow."""
        return bool(states) and all(not stack for stack, _, _ in states)

    def may_end(self, states: frozenset[State]) -> bool:
        """Whether the text read so far is a whole value (a top-level number may still go on)."""
        return any(not stack or (len(stack) == 1 and self._ends_here(stack[0])) for stack, _, _ in states)

    def _ends_here(self, frame: tuple) -> bool:
        """Whether a value that is the whole output (a number, raw text) may end after what it has read."""
        if frame[0] == "N":
            return self._number_ends(frame)
        if frame[0] == "V":  # nothing read yet: a pattern that matches the empty text may end here
            node = self.nodes[frame[1]]
            return node.kind == "regex" and node.pattern.accepts(node.pattern.initial())
        return frame[0] == "R" and not frame[4] and self.nodes[frame[2]].pattern.accepts(frame[3])

    def string_body_room(self, states: frozenset[State]) -> int | None:
        """How many more characters of plain text (no '"', '\\' or control bytes) every state can take inside
        the same string's body (`sys.maxsize` when unbounded); None unless all states are in that body."""
        frames = {stack[-1] if stack else None for stack, _, _ in states}
        if len(frames) != 1:
            return None
        (frame,) = frames
        if frame is None or frame[0] != "S" or frame[1] != "body":
            return None
        node = None if frame[2] is None else self.nodes[frame[2]]
        return sys.maxsize if node is None or node.max_length is None else node.max_length - frame[3]

    # -- one frame ---------------------------------------------------------------------------

    def _step(self, stack: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        if not stack:
            return []
        top, rest = stack[-1], stack[:-1]
        kind = top[0]
        if kind == "V" and self._node(top[1]).kind in ("text", "regex"):
            return self._start(rest, top[1], byte)  # raw text: its blanks are its own, not JSON's
        if kind in ("Q", "R"):
            return self._pattern_text(rest, top, byte)
        if kind == "S":
            return self._string(rest, top, byte)
        if kind == "L":
            return self._literal(rest, top, byte)
        if kind == "N":
            return self._number(rest, top, byte)
        if byte in WHITESPACE:
            phase = top[1] if kind == "P" else top[-1] if kind in "OA" else None
            if phase == "colon":
                return []
            return [(stack, LINE_FIRST if phase == "after" else GAP)]
        if kind == "V":
            return self._start(rest, top[1], byte, unique=len(top) > 2)
        if kind == "O":
            return self._object(rest, top, byte)
        if kind == "P":
            return self._any_object(rest, top, byte)
        return self._array(rest, top, byte)

    def _start(self, rest: tuple, node_id: int, byte: int, seen: frozenset[int] = frozenset(),
               unique: bool = False) -> list[tuple[tuple, str | None]]:
        """A value of node `node_id` beginning with the non-blank `byte` (`seen`: the anyOf nodes already
        expanded for this byte, so a schema whose alternatives refer back to it cannot loop; `unique`: an item of
        an array whose items must differ, which `rest[-1]` holds the items of so far)."""
        node = self._node(node_id)
        kind = node.kind
        if kind == "any_of":
            if node_id in seen:
                return []
            seen = seen | {node_id}
            return [found for alternative in node.alternatives for found in self._start(rest, alternative, byte, seen)]
        if kind in ("literals", "text"):
            literals = tuple(literal for literal in node.literals if literal not in rest[-1][4]) if unique else node.literals
            return self._literal(rest, ("L", literals, 0, ()), byte) if literals else []
        if kind == "regex":
            return self._pattern_text(rest, ("R", "body", node_id, node.pattern.initial(), b"", 0), byte)
        if kind == "string" and node.pattern is not None and byte == ord('"'):
            return [(rest + (("Q", "body", node_id, node.pattern.initial(), b"", 0),), None)]
        if kind in ("any", "any_object") and byte == ord("{"):
            return [(rest + (("P", "open", node.items if kind == "any_object" else ANY),), None)]
        if kind == "object" and byte == ord("{"):
            return [(rest + (("O", node_id, 0, "open"),), None)]
        if kind in ("any", "array") and byte == ord("["):
            items_so_far = (frozenset(),) if node.unique else ()
            return [(rest + (("A", ANY_ARRAY if kind == "any" else node_id, 0, "open", *items_so_far),), None)]
        if kind in ("any", "string") and byte == ord('"'):
            if unique:  # its text is kept, to tell it from the items before it
                return [(rest + (("S", "body", node_id, 0, b""),), None)]
            return [(rest + (("S", "body", node_id, 0) if node.is_bounded else STRING_BODY,), None)]
        if kind in ("any", "number", "integer") and (byte == ord("-") or byte in DIGITS):
            kept = node_id if node.is_bounded or unique else None  # a frame with its node keeps its text
            return self._number(rest, ("N", kind == "integer", "start", kept, ""), byte)
        if kind in ("any", "boolean") and byte in b"tf":
            return self._literal(rest, ("L", (b"true", b"false"), 0, ()), byte)
        if kind in ("any", "null") and byte == ord("n"):
            return self._literal(rest, ("L", (b"null",), 0, ()), byte)
        return []

    def _node(self, node_id: int) -> Node:
        return ANY_ARRAY_NODE if node_id == ANY_ARRAY else self.nodes[node_id]

    def _string(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        """One byte of a string's body. A unique array's item keeps its text (a fifth field) until its closing
        quote, which is refused when an earlier item has the same value."""
        _, phase, node_id, count = top[:4]
        node = None if node_id is None else self.nodes[node_id]
        if len(top) > 4:  # an item of a unique array: its text is kept
            text = top[4]
            if phase in BODY_PHASES and byte == ord('"'):
                key = json.loads(b'"' + text + b'"')
                return [] if key in rest[-1][4] else [(_finish_value(rest, item=key), None)]
            return [(stack[:-1] + (stack[-1] + (text + bytes([byte]),),), whitespace)
                    for stack, whitespace in self._string(rest, top[:4], byte)]  # fmt: skip
        if phase in BODY_PHASES:
            if byte == ord('"'):
                return [(_finish_value(rest), None)] if node is None or count >= node.min_length else []
            if byte < 0x20:
                return []
            following = ("escape_high" if phase == "high" else "escape") if byte == ord("\\") else "body" if byte < 0x80 else UTF8_LEADS.get(byte)
            if following is None:  # a continuation byte with no lead, or a byte UTF-8 never uses
                return []
            if node is not None and counts_as_character(byte):  # an escape counts as one character, at its backslash
                if node.max_length is not None and count >= node.max_length:
                    return []
                count += 1
            return [(rest + (("S", following, node_id, count),), None)]
        if isinstance(phase, tuple) and phase[0] == "utf8":  # inside a multi-byte character: bytes still to come, their first's range
            _, remaining, low, high = phase
            if not low <= byte <= high:
                return []
            return [(rest + (("S", ("utf8", remaining - 1, 0x80, 0xBF) if remaining > 1 else "body", node_id, count),), None)]
        if phase in ("escape", "escape_high"):
            if byte == ord("u"):
                digits = 4 if node is None else ("hex", 4, phase == "escape_high", None)  # a counted string tracks surrogates
                return [(rest + (("S", digits, node_id, count),), None)]
            return [(rest + (("S", "body", node_id, count),), None)] if byte in ESCAPES else []
        if byte not in HEX_DIGITS:
            return []
        if isinstance(phase, int):  # an uncounted string's \u escape
            return [(rest + (("S", phase - 1 if phase > 1 else "body", node_id, count),), None)]
        following, count = _escape_digit(phase, byte, count)
        return [(rest + (("S", following, node_id, count),), None)]

    def _pattern_text(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        """One byte of text matched by a regular expression: raw (`R`, the whole output) or a JSON string's
        body (`Q`, escapes read as the characters they stand for). `pending` holds a character's bytes (or an
        escape's hex digits) until it is whole."""
        kind, phase, node_id, states, pending, count = top
        node = self.nodes[node_id]
        if kind == "Q" and phase == "body" and not pending:
            if byte == ord('"'):
                return [(_finish_value(rest), None)] if node.pattern.accepts(states) and node.length_fits(count) else []
            if byte == ord("\\"):  # an escape can stand for any character: refused only where none may come
                return [(rest + (("Q", "escape", node_id, states, b"", count),), None)] if self._may_read(node, states, count, 0, MAX_CODE_POINT) else []
            if byte < 0x20:
                return []
        if phase == "escape":
            if byte == ord("u"):
                return [(rest + (("Q", "hex", node_id, states, b"", count),), None)]
            return self._pattern_char(rest, top, JSON_ESCAPES[byte]) if byte in JSON_ESCAPES else []
        if phase == "hex":
            if byte not in HEX_DIGITS:
                return []
            if len(pending) < 3:
                digits = pending + bytes([byte])
                first, last = int(digits + b"0" * (4 - len(digits)), 16), int(digits + b"f" * (4 - len(digits)), 16)
                return [(rest + (("Q", "hex", node_id, states, digits, count),), None)] if self._may_read(node, states, count, first, last) else []
            return self._pattern_char(rest, top, chr(int(pending + bytes([byte]), 16)))
        whole, character = _utf8_character(pending + bytes([byte]))
        if not whole:
            if character is not None or not self._may_read(node, states, count, *_utf8_span(pending + bytes([byte]))):
                return []
            return [(rest + ((kind, phase, node_id, states, pending + bytes([byte]), count),), None)]
        return self._pattern_char(rest, top, character)

    @staticmethod
    def _may_read(node: Node, states: frozenset[int], count: int, first: int, last: int) -> bool:
        """Whether the character being read (one from code point `first` to `last`) can still keep a match alive
        (within the lengths, where they are counted): a partial character nothing could complete is refused."""
        following = node.pattern.step_any(states, first, last)
        if node.lengths is None:
            return bool(following)
        window = node.length_window(count + 1)
        return any(node.lengths[state] & window for state in following)

    def _pattern_char(self, rest: tuple, top: tuple, character: str) -> list[tuple[tuple, str | None]]:
        kind, _, node_id, states, _, count = top
        node = self.nodes[node_id]
        following = node.pattern.step(states, character)
        if node.lengths is not None:  # counted: the characters so far must leave a match within the lengths
            count += 1
            window = node.length_window(count)
            if not any(node.lengths[state] & window for state in following):
                return []
        if not following:
            return []
        if kind == "R" and node.pattern.accepts(following) and node.pattern.is_dead_end(following):
            return [(_finish_value(rest), None)]  # nothing can follow: the output is complete
        return [(rest + ((kind, "body", node_id, following, b"", count),), None)]

    def _literal(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        """One more byte of one of the frame's literals; a literal spelled out whole finishes the value.

        `tags` (beside the literals, or empty) tell an object which property's key was spelled."""
        _, literals, position, tags = top
        matching = [(literal, tag) for literal, tag in zip(literals, tags or (None,) * len(literals), strict=True)
                    if literal[position] == byte]  # fmt: skip
        found = [(_finish_value(rest, tag, item=literal), None) for literal, tag in matching if len(literal) == position + 1]
        longer = [(literal, tag) for literal, tag in matching if len(literal) > position + 1]
        if longer:
            frame = ("L", tuple(literal for literal, _ in longer), position + 1, tuple(tag for _, tag in longer) if tags else ())
            found.append((rest + (frame,), None))
        return found

    def _number(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        """One byte of a number. An item of a unique array ends only as a value no earlier item has (an integer
        item does not even start as a 0 that is taken: nothing could follow it)."""
        _, is_integer, phase, node_id, text = top
        items_so_far = rest[-1][4] if _holds_unique_items(rest) else None
        following = _number_phase(phase, byte, is_integer, has_exponent=node_id is None)  # bounded: decimal notation
        if following is not None:
            if node_id is None:
                return [(rest + (("N", is_integer, following, None, ""),), None)]
            node, text = self.nodes[node_id], text + chr(byte)
            if not number_reachable(text, is_integer, node.lower, node.upper, node.multiple_of):
                return []
            if following == "zero" and is_integer and items_so_far is not None and Fraction(0) in items_so_far:
                return []
            return [(rest + (("N", is_integer, following, node_id, text),), None)]
        if not self._number_ends(top):
            return []
        if items_so_far is None:
            return self._step(_finish_value(rest), byte)  # the byte after a number belongs to what holds it
        key = Fraction(text)
        return [] if key in items_so_far else self._step(_finish_value(rest, item=key), byte)

    def _number_ends(self, frame: tuple) -> bool:
        """Whether the number read so far is whole (and, when bounded, inside its range)."""
        _, is_integer, phase, node_id, text = frame
        if phase not in NUMBER_ENDS:
            return False
        node = None if node_id is None else self.nodes[node_id]
        return node is None or number_within(text, is_integer, node.lower, node.upper, node.multiple_of)

    def _object(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        _, node_id, index, phase = top
        properties = self.nodes[node_id].properties
        if phase in KEY_PHASES and byte == ord('"'):
            offered = []
            for j in range(index, len(properties)):
                offered.append(j)
                if properties[j].required:
                    break  # a required property cannot be skipped
            keys = tuple(properties[j].key_json for j in offered)
            return self._literal(rest + (top,), ("L", keys, 0, tuple(offered)), byte)
        if phase == "colon" and byte == ord(":"):
            return [(rest + (("O", node_id, index + 1, "after"), ("V", properties[index].node)), None)]
        if phase == "after" and byte == ord(",") and index < len(properties):
            return [(rest + (("O", node_id, index, "key"),), None)]
        closes = phase == "after" or phase == "open"
        if closes and byte == ord("}") and not any(p.required for p in properties[index:]):
            return [(_finish_value(rest), None)]
        return []

    def _any_object(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        _, phase, values = top
        if phase in KEY_PHASES and byte == ord('"'):
            return [(rest + (top, STRING_BODY), None)]
        if phase == "colon" and byte == ord(":"):
            return [(rest + (("P", "after", values), ("V", values)), None)]
        if phase == "after" and byte == ord(","):
            return [(rest + (("P", "key", values),), None)]
        if phase in ("open", "after") and byte == ord("}"):
            return [(_finish_value(rest), None)]
        return []

    def _array(self, rest: tuple, top: tuple, byte: int) -> list[tuple[tuple, str | None]]:
        """One byte of an array between its items. A unique array (a fifth field: its items so far) takes another
        item only while one differing from them can still come."""
        _, node_id, count, phase = top[:4]
        node = self._node(node_id)
        at_most = (node.max_items is None or count < node.max_items) and self._has_new_item(node, top)
        if byte == ord("]") and (phase == "after" or (phase == "open" and node.min_items == 0)) and count >= node.min_items:
            return [(_finish_value(rest), None)]
        item = node.prefix_items[count] if count < len(node.prefix_items) else node.items
        advanced = ("A", node_id, self._counted(node, count + 1), "after", *top[4:])
        if phase == "after" and byte == ord(",") and at_most:
            return [(rest + (advanced, ("V", item, "unique") if node.unique else ("V", item)), None)]
        if phase == "open" and at_most:
            return self._start(rest + (advanced,), item, byte, unique=node.unique)
        return []

    def _has_new_item(self, node: Node, top: tuple) -> bool:
        """Whether an item unlike every one so far can come (always, unless the items are a few fixed values)."""
        if not node.unique:
            return True
        items = self.nodes[node.items]
        return items.kind != "literals" or any(literal not in top[4] for literal in items.literals)

    @staticmethod
    def _counted(node: Node, count: int) -> int:
        """An item count kept only as far as the array's bounds and prefix need it, so unbounded arrays share states."""
        return min(count, max(node.min_items, node.max_items or 0, len(node.prefix_items)))


ANY_ARRAY_NODE = Node("array", items=ANY)


def _finish_value(rest: tuple, tag: int | None = None, item: object = None) -> tuple:
    """The stack once the value on top of `rest` is complete: an object that was reading a key now wants ':'
    (a schema'd object's key literal is tagged with its property's index, which the colon phase keeps); a unique
    array adds `item` (the value's key: its literal JSON, its string, its number) to its items so far."""
    if not rest:
        return rest
    parent = rest[-1]
    if _holds_unique_items(rest):
        return rest[:-1] + (parent[:4] + (parent[4] | {item},),)
    if parent[0] == "O" and parent[3] in KEY_PHASES:
        return rest[:-1] + (("O", parent[1], tag, "colon"),)
    if parent[0] == "P" and parent[1] in KEY_PHASES:
        return rest[:-1] + (("P", "colon", parent[2]),)
    return rest


def _escape_digit(phase: tuple, byte: int, count: int) -> tuple[object, int]:
    """A counted string's phase and character count after one more hex digit of a \\u escape. `phase` is ("hex",
    digits left, whether a high surrogate escape came just before, what the digits so far make: None, "D" (a first
    digit d), "high" (d8-db), "low" (dc-df) or "other"). A low surrogate right after a high one is the same character:
    it gives back the count its backslash took, as JSON Schema counts code points."""
    _, remaining, after_high, shape = phase
    if remaining == 4:
        shape = "D" if byte in b"dD" else "other"
    elif remaining == 3 and shape == "D":
        shape = "high" if byte in b"89abAB" else "low"
    if remaining > 1:
        return ("hex", remaining - 1, after_high, shape), count
    if shape == "high":
        return "high", count
    return "body", count - 1 if shape == "low" and after_high else count


def _holds_unique_items(rest: tuple) -> bool:
    """Whether the value above `rest` is an item of an array whose items must differ."""
    return bool(rest) and rest[-1][0] == "A" and len(rest[-1]) > 4


def _number_phase(phase: str, byte: int, is_integer: bool, has_exponent: bool = True) -> str | None:
    """The number's phase after `byte`, or None where `byte` cannot continue it."""
    is_digit = byte in DIGITS
    if phase in ("start", "minus"):
        if phase == "start" and byte == ord("-"):
            return "minus"
        return "zero" if byte == ord("0") else "int" if is_digit else None
    if phase in ("int", "frac", "exp") and is_digit:
        return phase
    if phase in ("dot", "exponent_sign", "e"):
        if phase == "e" and byte in b"+-":
            return "exponent_sign"
        return ("frac" if phase == "dot" else "exp") if is_digit else None
    if is_integer:
        return None
    if phase in ("zero", "int") and byte == ord("."):
        return "dot"
    if phase in ("zero", "int", "frac") and byte in b"eE" and has_exponent:
        return "e"
    return None


def _utf8_span(data: bytes) -> tuple[int, int]:
    """The lowest and highest code points whose UTF-8 encoding starts with `data` (a lead byte and some
    continuation bytes, checked by _utf8_character); first above last where none does."""
    length = 2 if data[0] < 0xE0 else 3 if data[0] < 0xF0 else 4
    value = data[0] & (0x7F >> length)
    for byte in data[1:]:
        value = value << 6 | (byte & 0x3F)
    missing = 6 * (length - len(data))
    least = (0x80, 0x800, 0x10000)[length - 2]  # shorter encodings of lower code points are not UTF-8
    return max(value << missing, least), min((value << missing) | ((1 << missing) - 1), MAX_CODE_POINT)


def _utf8_character(data: bytes) -> tuple[bool, str | None]:
    """(whole, character) of a character's UTF-8 bytes so far: (True, it), (False, None) while more bytes
    may come, (False, "") when they can never form one."""
    lead = data[0]
    length = 1 if lead < 0x80 else 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF5 else 0
    if not length or any(not 0x80 <= b < 0xC0 for b in data[1:]):
        return False, ""
    if len(data) < length:
        return False, None
    try:
        return True, data.decode("utf-8")
    except UnicodeDecodeError:
        return False, ""
