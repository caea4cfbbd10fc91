"""Transcript text as the model is prompted with it: numbers spelled out, whitespace collapsed.

Orpheus is prompted with written text, and a voice learns to read what it was trained on; a
transcript saying "2026" under audio saying "twenty twenty-six" teaches the wrong mapping, so
digits become words here (English cardinals, ordinals, decimals, percent and currency signs).
Emotion tags such as ``<laugh>`` are kept as they are. Pure functions, no I/O.
"""

from __future__ import annotations

import re
import unicodedata

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                  "nine": "ninth", "twelve": "twelfth"}
_CURRENCY = {"$": ("dollar", "dollars"), "€": ("euro", "euros"), "£": ("pound", "pounds")}

_NUMBER = re.compile(
    r"(?P<cur>[$€£])?(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d+))?(?P<ord>st|nd|rd|th)?(?P<pct>\s?%)?"
)
_SPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")


def cardinal(n: int) -> str:
    """0 <= n < 10**15 in English words: 2026 -> 'two thousand twenty-six'."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {cardinal(rest)}" if rest else "")
    for scale, word in _SCALES:
        if n >= scale:
            high, rest = divmod(n, scale)
            return f"{cardinal(high)} {word}" + (f" {cardinal(rest)}" if rest else "")
    raise ValueError(f"{n} is out of range")


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    words = cardinal(n)
    head, sep, last = words.rpartition("-") if "-" in words.rsplit(" ", 1)[-1] else words.rpartition(" ")
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return f"{head}{sep}{last}"


def _spell(match: re.Match) -> str:
    digits = match["int"].replace(",", "")
    if len(digits) > 15:
        return match[0]
    n = int(digits)
    if match["ord"] and not match["frac"]:
        return ordinal(n)
    words = cardinal(n)
    if match["frac"]:
        words += " point " + " ".join(_ONES[int(d)] for d in match["frac"])
    if match["pct"]:
        words += " percent"
    if match["cur"]:
        singular, plural = _CURRENCY[match["cur"]]
        words += " " + (singular if n == 1 and not match["frac"] else plural)
    return words + (match["ord"] if match["ord"] and match["frac"] else "")


def normalize(text: str) -> str:
    """The text a clip is trained with."""
    text = unicodedata.normalize("NFKC", text)
    text = _NUMBER.sub(_spell, text)
    text = _SPACE.sub(" ", text).strip()
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text)


_SENTENCE_END = re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"')\]]))\s+(?=\S)")


def sentences(text: str) -> list[str]:
    """Split a transcript into sentences: one per non-empty line, lines split after . ! ? …"""
    out: list[str] = []
    for line in text.splitlines():
        out.extend(part.strip() for part in _SENTENCE_END.split(line) if part.strip())
    return out
