"""Workloads for `ember bench spec`: input-grounded prompts (where speculation should pay) and a control.

| workload | prompt | why |
|---|---|---|
| code-edit | a generated Python module + "rename this function, return the whole file" | the answer copies most of its input |
| quote-summary | a corpus passage + "summarise, quoting key sentences word for word" | quotes are runs of the input |
| free-story | "write a short story about ..." | nothing to copy: speculation must not cost much here |

Everything is generated from a seed (code from word lists, passages from the shared corpus) and
rendered with the model's chat template, so every run and every engine sees the same tokens.
"""

from __future__ import annotations

import random

from ember.bench.workloads import BenchRequest, Workload, corpus_text

SPEC_WORKLOADS = ("code-edit", "quote-summary", "free-story")
CONTROL_WORKLOADS = ("free-story",)  # nothing to copy from the input: the others are input-grounded

_NOUNS = ("price", "score", "weight", "order", "record", "sample", "reading", "invoice", "ticket", "packet", "token", "entry")
_VERBS = ("scale", "filter", "count", "normalise", "merge", "clip", "round", "shift", "tally", "group")
_TOPICS = ("a lighthouse keeper", "a lost robot", "a baker who cannot sleep", "two rival gardeners", "a river that talks")
_SETTINGS = ("in winter", "on a night train", "in a city of glass", "at the edge of a desert", "during a long storm", "on market day")


def _function(rng: random.Random) -> str:
    noun = rng.choice(_NOUNS)
    verb = rng.choice(_VERBS)
    limit = rng.randint(2, 99)
    op = rng.choice(("*", "+", "-", "//"))
    return (
        f"def {verb}_{noun}s({noun}s, limit={limit}):\n"
        f'    """{verb.capitalize()} every {noun} and keep those under the limit."""\n'
        f"    result = []\n"
        f"    for {noun} in {noun}s:\n"
        f"        value = {noun} {op} {rng.randint(2, 9)}\n"
        f"        if value < limit:\n"
        f"            result.append(value)\n"
        f"    return result\n"
    )


def _code_edit_prompt(rng: random.Random, num_functions: int = 5) -> str:
    functions = [_function(rng) for _ in range(num_functions)]
    old_name = functions[0].split("(")[0].removeprefix("def ")
    code = "\n\n".join(functions)
    return (
        f"Here is a Python module:\n\n```python\n{code}```\n\n"
        f"Rename the function `{old_name}` to `{old_name}_v2` and return the whole module, unchanged otherwise."
    )


def _passage(text: str, rng: random.Random, num_chars: int = 1200) -> str:
    start = rng.randrange(max(1, len(text) - num_chars))
    start = text.find("\n", start) + 1
    end = text.rfind(".", start, start + num_chars) + 1
    return " ".join(text[start : end if end > start else start + num_chars].split())


def _quote_summary_prompt(rng: random.Random, text: str) -> str:
    return (
        f"Passage:\n\"{_passage(text, rng)}\"\n\n"
        "Summarise the passage in a few sentences, quoting its most important sentences word for word."
    )


def _free_story_prompt(rng: random.Random) -> str:
    return f"Write a short story about {rng.choice(_TOPICS)} {rng.choice(_SETTINGS)}."


def build_spec_workload(name: str, tokenizer, seed: int = 0, num_requests: int = 3, output_len: int = 128) -> Workload:
    """`num_requests` prompts of workload `name`, chat-templated and tokenized with `tokenizer`."""
    if name not in SPEC_WORKLOADS:
        raise ValueError(f"unknown speculation workload {name!r}; choose from {', '.join(SPEC_WORKLOADS)}")
    rng = random.Random(seed * len(SPEC_WORKLOADS) + SPEC_WORKLOADS.index(name))
    text, source = corpus_text() if name == "quote-summary" else ("", "generated")
    makers = {
        "code-edit": lambda: _code_edit_prompt(rng),
        "quote-summary": lambda: _quote_summary_prompt(rng, text),
        "free-story": lambda: _free_story_prompt(rng),
    }
    requests = [
        BenchRequest(f"{name}-{i}", encode_chat(tokenizer, makers[name]()), output_len, role=name)
        for i in range(num_requests)
    ]
    params = {"num_requests": num_requests, "output_len": output_len, "prompt_len": [r.prompt_len for r in requests]}
    return Workload(name, seed, requests, params, source)


def encode_chat(tokenizer, content: str) -> list[int]:
    """The user message rendered with the model's chat template (plain text if it has none)."""
    from ember.tokenizers.chat_template import load_chat_template

    template = load_chat_template(tokenizer)
    if template is None:
        return tokenizer.encode(content, add_special_tokens=True)
    rendered = template.render([{"role": "user", "content": content}], add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)
