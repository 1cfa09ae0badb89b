"""A thinking model's reasoning apart from its answer (vLLM's `--reasoning-parser`): `reasoning_content` and `content`.

Qwen3, SmolLM3 and DeepSeek-R1 think between `<think>` and `</think>` before they answer. With a parser named, a chat
reply's text up to `</think>` becomes the message's `reasoning_content` and only the rest is its `content` (tool calls
are read from the content alone). The two parsers differ where the tags are missing, as vLLM's do:

- `deepseek_r1`: its template opens `<think>` in the prompt, so a reply is reasoning until `</think>` (all of it if
  the tag never comes: a reply cut off while thinking);
- `qwen3`: a reply reasons only if it opens with `<think>` (with thinking off the template closes an empty one in the
  prompt, and the reply is all content); one that never closes it is reasoning throughout. (A template that opens
  the tag in the prompt, as Qwen3's thinking-only models do, wants `deepseek_r1`.)
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "qwen3")


def split_reasoning(text: str, parser: str) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply."""
    reasoning, content = ReasoningStream(parser).split(text, is_last=True)
    return (reasoning or None), content


@dataclass
class ReasoningStream:
    """Splits a streamed reply's text deltas into (reasoning, content) deltas. A suffix that may be the start of a tag
    is held back until the next delta (or `finish`) tells."""

    parser: str
    phase: str = "start"  # "start" (whether the reply opens with <think> not yet known), "reasoning", "content"
    held: str = ""
    reasoned: bool = False  # whether any of the reply was reasoning

    def __post_init__(self) -> None:
        if self.parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning parser {self.parser!r} is unknown; choose one of {', '.join(REASONING_PARSERS)}")

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning, content) this delta adds."""
        text = self.held + delta
        self.held = ""
        if self.phase == "start":
            text = self._open(text)
            if self.phase == "start":  # still a prefix of <think>
                return "", ""
        if self.phase == "content":
            return "", text
        return self._reason(text)

    def split(self, delta: str, is_last: bool) -> tuple[str, str]:
        """(reasoning, content) of one step's delta; the last step's take what was held back too."""
        reasoning, content = self.feed(delta)
        if is_last:
            more_reasoning, more_content = self.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the reply has ended."""
        held, self.held = self.held, ""
        if self.phase == "start":  # a reply shorter than <think>: the parser's default decides
            self.phase = self._unopened_phase()
        return (held, "") if self.phase == "reasoning" else ("", held)

    def _open(self, text: str) -> str:
        """Decide from the reply's start whether it reasons; returns the text after an opening tag."""
        stripped = text.lstrip()
        if stripped.startswith(THINK_OPEN):
            self.phase, self.reasoned = "reasoning", True
            return stripped[len(THINK_OPEN):]
        if THINK_OPEN.startswith(stripped):
            self.held = text
            return ""
        self.phase = self._unopened_phase()
        return text

    def _unopened_phase(self) -> str:
        """A reply without <think>: reasoning for deepseek_r1 (its prompt opened the tag), content for qwen3."""
        if self.parser == "deepseek_r1":
            self.reasoned = True
            return "reasoning"
        return "content"

    def _reason(self, text: str) -> tuple[str, str]:
        end = text.find(THINK_CLOSE)
        if end >= 0:
            self.phase = "content"
            return text[:end], text[end + len(THINK_CLOSE):]
        keep = _partial_suffix(text, THINK_CLOSE)
        self.held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep], ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
