"""Where the worker may cut a context's streamed text into segments itself (`"chunking": "auto"`).

A caller streaming an LLM's tokens should not have to find sentence ends: with auto chunking the
worker speaks each complete sentence as soon as the next word shows that it is complete, and a
sentence that takes longer than the context's buffer delay to arrive is spoken up to its last
clause break, else its last word break. Where the cut may fall is decided by the text front end,
not by punctuation alone: a cut goes between two spoken words whose spoken text has a sentence
end (or a clause break) between them, so "Dr. Smith", "3.5", "bob@x.com", "3:30 p.m." and
"<laugh>" are never cut inside (each is one written token the front end reads whole), and the
last `HOLD_WORDS` words are never spoken early (a word's reading can depend on the next few:
"5" then "kg"). Only the text's tail is read (`SCAN_CHARS`), so a caller pushing a character at
a time pays a bounded cost per push however long its buffer grows.

Pure: the context owns the buffer, the clock and the segments.
"""

from __future__ import annotations

import re
from typing import Final

from gpu_worker.text import normalize
from gpu_worker.text.stream import HOLD_WORDS

__all__ = ["HOLD_WORDS", "SCAN_CHARS", "clause_cut", "sentence_cut"]

SCAN_CHARS: Final = 512  # the tail of the buffer read for a cut (sentences are far shorter)
_SENTENCE_MARKS: Final = frozenset(".!?…")
_CLAUSE_MARKS: Final = frozenset(",;:—–")
_CANDIDATE: Final = re.compile(r"[.!?…]\S*\s+\S+\s")  # a sentence mark, then a whole word: worth reading


def _gaps(text: str) -> tuple[int, list[tuple[str, int]]]:
    """(where the read tail starts, [(spoken text between word i and i+1, written start of word i+1)])
    over the words of the text's tail, the last word left out unless whitespace closes it."""
    start = 0
    if len(text) > SCAN_CHARS:
        space = text.find(" ", len(text) - SCAN_CHARS)
        start = space + 1 if space >= 0 else len(text)
    tail = text[start:]
    read = normalize(tail)
    words = read.words
    gaps = []
    for before, after in zip(words, words[1:]):
        if after.written_start < before.written_end:
            continue  # one written token read as several words: never cut inside it
        gaps.append((read.text[before.end:after.start], after.written_start))
    complete = len(tail) - len(tail.rstrip())  # whitespace closes the last word
    return start, gaps if complete else gaps[:-1]


def sentence_cut(text: str) -> int | None:
    """The index to cut ``text`` at (the start of the first word after the last complete sentence),
    or None. The word after the sentence end must be complete: it shows the mark was a sentence end."""
    if not _CANDIDATE.search(text, max(0, len(text) - SCAN_CHARS)):
        return None
    start, gaps = _gaps(text)
    for spoken, at in reversed(gaps):
        if _SENTENCE_MARKS.intersection(spoken):
            return start + at
    return None


def clause_cut(text: str) -> int | None:
    """Past the buffer delay: the cut after the last clause break, else after the last word, that
    leaves `HOLD_WORDS` words unspoken; None when the text is no longer than that."""
    start, gaps = _gaps(text)
    usable = gaps[:max(0, len(gaps) - HOLD_WORDS + 1)]  # gap k precedes word k+1: keep the last HOLD_WORDS
    for spoken, at in reversed(usable):
        if _CLAUSE_MARKS.intersection(spoken) or _SENTENCE_MARKS.intersection(spoken):
            return start + at
    return start + usable[-1][1] if usable else None
