"""The parity corpus: samples cut from ../shared/corpus plus generated edge cases.

Deterministic (fixed seed), so a parity failure names a sample index that reproduces.
"""

from __future__ import annotations

import random
from pathlib import Path

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    "我们今天去公园散步，天气非常好。机器学习是人工智能的一个分支。",
    "東京は日本の首都です。ひらがなとカタカナと漢字を使います。",
    "안녕하세요. 오늘 날씨가 정말 좋네요. 한국어 토큰화는 비쌉니다.",
    "नमस्ते, आप कैसे हैं? हिंदी भाषा देवनागरी लिपि में लिखी जाती है।",
    "مرحبا بالعالم. اللغة العربية تكتب من اليمين إلى اليسار.",
    "Привет, мир! Как дела? Русский язык использует кириллицу.",
    "Γειά σου Κόσμε! Ελληνικά γράμματα.",
    "שלום עולם, זה טקסט בעברית.",
    "Xin chào thế giới. Tiếng Việt có nhiều dấu.",
    "Ça va? Très bien, merci! Où est la bibliothèque? Naïve café.",
    "Straße, Größe, Übermäßig — ÄÖÜ äöü ß.",
    "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 🇯🇵 🙂‍↔️",
    "RTL marks: \u200fabc\u200e def \u202eevil\u202c and zero\u200bwidth\u2060joiner",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, π ≈ 3.14159, ∞ ≠ 0",
    "URLs: https://example.com/path?q=1&r=two#frag user@example.org",
    'JSON: {"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b"}}',
    "Don't you'll they're I'm we've she'd IT'S YOU'LL He'S",
    "tabs\tand\t\ttabs\n\nnew\r\nlines\r\n\n\n   indented\n\t\tcode",
]

WHITESPACE = [
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    " \n",
    "\u3000",
    "\u00a0",
    "\t\t",
    "    ",
]

PIECES = [
    "hello",
    "world",
    "Hello",
    " the",
    "123",
    "4567",
    "3.14",
    "-",
    "_",
    "'s",
    "'LL",
    "!",
    "?",
    "...",
    "——",
    "日本",
    "中文",
    "한국",
    "हिंदी",
    "عربي",
    "кот",
    "🙂",
    "👨‍💻",
    "é",
    "e\u0301",
    "x",
    "(",
    ")",
    "[]",
    "{}",
    "<",
    ">",
    "//",
    "#",
    "$",
    "%",
    "^",
    "&&",
    "||",
    "==",
]


def _numbers(rng: random.Random) -> list[str]:
    samples = []
    for length in range(1, 41):
        samples.append("".join(rng.choice("0123456789") for _ in range(length)))
        samples.append(" " + "".join(rng.choice("0123456789") for _ in range(length)) + " apples")
    samples += ["1,000,000", "3.14159265358979", "٣٤٥", "१२३", "Ⅻ", "½", "²³"]
    return samples


def _random_mix(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 25)):
        roll = rng.random()
        if roll < 0.5:
            parts.append(rng.choice(PIECES))
        elif roll < 0.8:
            parts.append(rng.choice(WHITESPACE))
        elif roll < 0.9:
            parts.append(
                chr(
                    rng.choice(
                        [
                            rng.randint(0x20, 0x7E),
                            rng.randint(0xA0, 0x2FFF),
                            rng.randint(0x3000, 0x9FFF),
                            rng.randint(0xAC00, 0xD7A3),
                            rng.randint(0x1F300, 0x1FAFF),
                        ]
                    )
                )
            )
        else:
            parts.append(rng.choice(MULTILINGUAL)[: rng.randint(1, 30)])
    return "".join(parts)


def build_corpus(
    shared_dir: Path, count: int = 5000, seed: int = 0, specials: tuple[str, ...] = ()
) -> list[str]:
    """`count` samples: a quarter slices of the shared English corpora, the rest multilingual
    text, code, whitespace runs, numbers, emoji, and (when given) special-token text."""
    rng = random.Random(seed)
    texts = [
        (shared_dir / "corpus" / name).read_text(encoding="utf-8")
        for name in ("tinyshakespeare.txt", "botchan.txt", "kjv.txt")
    ]
    samples = list(MULTILINGUAL) + _numbers(rng)
    samples += ["", " ", "\n", "a", " a", "  a", "a  ", "\t\n \t", " " * 40, "\n" * 20]
    samples += ["a   1", "x \n 2", "  3", "4  ", "5 \t 6", ".  7", "'s 8", "\u3000\u30009", "٣ ٤"]
    while len(samples) < count:
        kind = rng.random()
        if kind < 0.25:
            text = rng.choice(texts)
            start = rng.randrange(len(text))
            samples.append(text[start : start + rng.randint(1, 600)])
        elif kind < 0.45:
            samples.append(rng.choice(MULTILINGUAL) * rng.randint(1, 3))
        elif kind < 0.95 or not specials:
            samples.append(_random_mix(rng))
        else:
            samples.append(_random_mix(rng) + rng.choice(specials) + _random_mix(rng))
    return samples[:count]
