"""Transcript text as the model is prompted with it: the serving normalizer's reading.

Orpheus is prompted with written text, and a voice learns to read what it was trained on; a
transcript saying "2026" under audio saying "twenty twenty-six" teaches the wrong mapping. So a
transcript (given or from the ASR) goes through exactly the normalizer the worker prompts with
(`gpu_worker.text.normalize`: numbers, money, dates, times, units, abbreviations, acronyms, tags
kept whole), and a clip's prompt ids equal those of a request with the same written text.
Pure functions, no I/O.
"""

from __future__ import annotations

import re

from gpu_worker.text import normalize as _normalize
from gpu_worker.text.numbers import cardinal, ordinal

__all__ = ["cardinal", "normalize", "ordinal", "sentences"]


def normalize(text: str) -> str:
    """The text a clip is trained with: what the worker's prompt would hold for the same written text."""
    return _normalize(text).text


_SENTENCE_END = re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"')\]]))\s+(?=\S)")


def sentences(text: str) -> list[str]:
    """Split a transcript into sentences: one per non-empty line, lines split after . ! ? …"""
    out: list[str] = []
    for line in text.splitlines():
        out.extend(part.strip() for part in _SENTENCE_END.split(line) if part.strip())
    return out
