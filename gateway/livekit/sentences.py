"""Where streamed LLM text may be cut into segments: after each complete sentence.

An LLM's reply arrives a few characters at a time. The plugin forwards the text to the worker as
it comes and asks it to speak (a protocol `flush`) as soon as a sentence is complete, so the first
sentence is heard while the LLM is still writing the rest. A sentence end is a run of `.!?…`
(closing quotes and brackets included) followed by whitespace, or a newline; only the whitespace
proves the end ("3.5", "…" mid-thought), so a trailing run of end marks is held back until the
next chunk shows what follows it. Sentences shorter than ``min_chars`` (not counting whitespace)
join the next one (a lone "Hi." speaks with poor prosody), as livekit's own sentence tokenizers do.

Pure: no I/O, no framework types. `SentenceSplitter` turns chunks into `Piece`s in order; joined,
the pieces are exactly the text fed in, and where the flushes fall does not depend on how the text
was chunked.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["DEFAULT_MIN_SENTENCE_CHARS", "Piece", "SentenceSplitter"]

DEFAULT_MIN_SENTENCE_CHARS = 20  # livekit's basic/blingfire tokenizers default to 20 too

_MARKS = "[.!?…。！？]+[\"'”’»)\\]]*"
_END = re.compile(rf"{_MARKS}(?=\s)|\n")  # a sentence end, proven by the whitespace after it
_TRAILING_MARKS = re.compile(rf"{_MARKS}\Z")  # may end a sentence: wait for the next character


def _visible(text: str) -> int:
    """Characters that are not whitespace: how long a segment is, however its text was chunked."""
    return len(text) - sum(c.isspace() for c in text)


class Piece(NamedTuple):
    """Text to send, then (``flush``) ask the worker to speak everything sent so far."""

    text: str
    flush: bool


class SentenceSplitter:
    """Streamed text -> pieces, each complete sentence closed by a flush."""

    def __init__(self, min_chars: int = DEFAULT_MIN_SENTENCE_CHARS) -> None:
        if min_chars < 0:
            raise ValueError("min_chars must be >= 0")
        self.min_chars = min_chars
        self._held = ""  # trailing end marks not sent yet
        self._segment_chars = 0  # characters sent since the last flush

    def feed(self, chunk: str) -> list[Piece]:
        """The pieces `chunk` completes; a trailing run of end marks is held for the next call."""
        text, self._held = self._held + chunk, ""
        pieces: list[Piece] = []
        pos = 0
        for end in _END.finditer(text):
            candidate = text[pos:end.end()]
            if self._segment_chars + _visible(candidate) < self.min_chars:
                continue  # too short to speak alone: it joins the next sentence
            pieces.append(Piece(candidate, True))
            self._segment_chars, pos = 0, end.end()
        rest = text[pos:]
        if (marks := _TRAILING_MARKS.search(rest)) is not None:
            rest, self._held = rest[:marks.start()], rest[marks.start():]
        if rest:
            pieces.append(Piece(rest, False))
            self._segment_chars += _visible(rest)
        return pieces

    def flush(self) -> list[Piece]:
        """The caller asks to speak what it sent now (livekit's flush sentinel)."""
        held, self._held, self._segment_chars = self._held, "", 0
        return [Piece(held, True)]

    def end(self) -> list[Piece]:
        """No more text: whatever was held back (the protocol's `end` speaks it)."""
        held, self._held, self._segment_chars = self._held, "", 0
        return [Piece(held, False)] if held else []
