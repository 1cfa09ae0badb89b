"""The parity corpus: samples cut from ../shared/corpus plus generated edge cases.

Deterministic (fixed seed), so a parity failure names a sample index that reproduces.
"""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import regex

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

# Scripts with combining marks and joiners, where pre-tokenizers differ most (issue 15).
SCRIPTS = [
    "Tiếng Việt là ngôn ngữ chính thức của Việt Nam. Người Việt viết chữ Quốc ngữ.",
    "Điều 1. Mọi người sinh ra đều được tự do và bình đẳng về nhân phẩm và quyền lợi.",
    " Việt",
    "한국어는 한글로 씁니다. 대한민국의 수도는 서울입니다. 감사합니다!",
    "ᄒᆞᆫ글 옛한글 자모: ᄀᆞᆯ, 그리고 호환 자모 ㄱㄴㄷ ㅏㅑ.",
    "हिन्दी भारत की राजभाषा है। क्षत्रिय, श्रृंगार, द्वितीय, ज्ञान, पृथ्वी।",
    "संस्कृतम् जगतः एकतमा अतिप्राचीना समृद्धा शास्त्रीया च भाषा।",
    "العَرَبِيَّةُ لُغَةٌ سَامِيَّةٌ. مُحَمَّدٌ رَسُولُ اللّٰهِ. ٱلْحَمْدُ لِلَّهِ",
    "فارسی: می‌خواهم، نمی‌دانم. اردو: یہ ایک جملہ ہے۔",
    "ภาษาไทยเป็นภาษาราชการของประเทศไทย ผู้ใหญ่บ้าน น้ำใจ กำลังใจ",
    "ພາສາລາວ ແລະ ភាសាខ្មែរ ហើយ မြန်မာဘာသာ",
    "👨‍👩‍👧‍👦👩🏽‍💻🧑🏿‍🤝‍🧑🏻🏳️‍⚧️👁️‍🗨️❤️‍🩹🫱🏼‍🫲🏿🐻‍❄️",
    "flags 🇰🇷🇮🇳🇻🇳🇹🇭🏴󠁧󠁢󠁳󠁣󠁴󠁿 keycaps 1️⃣#️⃣*️⃣ skin 👋🏻👋🏼👋🏽👋🏾👋🏿",
    'def 안녕(이름: str) -> str:\n    return f"नमस्ते {이름}! สวัสดี"  # Việt\n',
    "const تحية = `مرحبا ${name}`; let 変数 = [1, 2, 3]; // ẞ ß ǅ ǈ",
    "SELECT tên, 나이 FROM người_dùng WHERE quốc_gia = 'Việt Nam' AND नाम != '';",
    "ǅemal ǈubljana ǋegoš — titlecase digraphs, ﬁ ﬂ ligatures, Ⅻ Ⅷ, ①②, ²³",
    "Ελληνικά: ἀρχὴ ἥμισυ παντός. Ὦ ξεῖν᾽. Кириллица: ёжик, Ї, Ґ.",
]

MULTILINGUAL += SCRIPTS + [unicodedata.normalize("NFD", text) for text in SCRIPTS]

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
    "e\u0323\u0302",
    "\u0301",
    "क्ष",
    "ญ่",
    "\u200d",
    "\ufe0f",
    "각",
    "\u1100\u1161\u11a8",
    "ـَ",
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


RANDOM_RANGES = [
    (0x20, 0x7E),
    (0xA0, 0x2FFF),
    (0x3000, 0x9FFF),
    (0xAC00, 0xD7A3),
    (0x1F300, 0x1FAFF),
    (0x0300, 0x036F),
    (0x0900, 0x097F),
    (0x0E00, 0x0E7F),
    (0x0600, 0x06FF),
    (0x10000, 0x3FFFF),  # lead byte 0xF0, which every vocabulary here has
]


def _random_character(rng: random.Random) -> str:
    """A random character from a script range, skipping code points assigned after Unicode 14
    (Python's unicodedata) that `regex` knows: the references carry older Unicode tables than
    `regex` (U+3E2C9 is a letter to `regex`, unassigned to tiktoken), a documented divergence."""
    while True:
        char = chr(rng.randint(*rng.choice(RANDOM_RANGES)))
        if unicodedata.category(char) != "Cn" or regex.fullmatch(r"\p{Cn}", char):
            return char


def _random_mix(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 25)):
        roll = rng.random()
        if roll < 0.5:
            parts.append(rng.choice(PIECES))
        elif roll < 0.8:
            parts.append(rng.choice(WHITESPACE))
        elif roll < 0.9:
            parts.append(_random_character(rng))
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
