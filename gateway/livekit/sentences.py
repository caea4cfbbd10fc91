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

Linear in the text: one pass over each chunk's characters with a little state carried between
chunks (whether a run of end marks is open, and the held run itself, kept as parts), so no input,
however adversarial (100k end marks, newlines, one character per chunk), costs more than a
constant per character. (Regexes with a lookahead after `+` backtrack over every run: quadratic.)
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DEFAULT_MIN_SENTENCE_CHARS", "Piece", "SentenceSplitter"]

DEFAULT_MIN_SENTENCE_CHARS = 20  # livekit's basic/blingfire tokenizers default to 20 too

END_MARKS = frozenset(".!?…。！？")
CLOSERS = frozenset("\"'”’»)]")  # closing quotes and brackets stay with the sentence they close


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
        self._reset()

    def _reset(self) -> None:
        self._held: list[str] = []  # the trailing run of end marks (and closers) not sent yet, in parts
        self._held_chars = 0  # its length (marks and closers are all visible)
        self._held_closed = False  # the held run ends with a closer: a mark after it starts a new run
        self._segment_chars = 0  # visible characters sent since the last flush

    def feed(self, chunk: str) -> list[Piece]:
        """The pieces `chunk` completes; a trailing run of end marks is held for the next call."""
        pieces: list[Piece] = []
        prefix, prefix_chars = self._held, self._held_chars  # unsent text before chunk[0]
        in_run, closed = bool(prefix), self._held_closed
        run_start = -1 if in_run else None  # where the open run starts in chunk (-1: in the held prefix)
        start, seen = 0, 0  # chunk[start:] is unsent; `seen` visible characters of it so far

        def cut(end: int) -> None:  # a sentence may end at chunk[end]: flush there if it is long enough
            nonlocal prefix, prefix_chars, start, seen
            if self._segment_chars + prefix_chars + seen < self.min_chars:
                return  # too short to speak alone: it joins the next sentence
            pieces.append(Piece("".join(prefix) + chunk[start:end], True))
            self._segment_chars, prefix, prefix_chars, start, seen = 0, [], 0, end, 0

        for i, c in enumerate(chunk):
            if c in END_MARKS:
                if not in_run or closed:
                    run_start = i
                in_run, closed = True, False
                seen += 1
            elif c in CLOSERS:
                closed = in_run
                seen += 1
            elif c.isspace():  # proves the end of an open run; a newline ends a segment by itself
                if in_run:
                    cut(i)
                in_run = closed = False
                if c == "\n":
                    cut(i + 1)
            else:
                in_run = closed = False
                seen += 1

        if in_run and run_start == -1:  # the held run goes on through the whole chunk
            prefix.append(chunk)  # in place: a run fed one mark at a time stays linear
            self._held, self._held_chars = prefix, prefix_chars + len(chunk)
            self._held_closed = closed
            return pieces
        stop = run_start if in_run else len(chunk)
        rest, rest_chars = "".join(prefix) + chunk[start:stop], prefix_chars + seen - (len(chunk) - stop)
        self._held, self._held_chars, self._held_closed = ([chunk[stop:]] if in_run else []), len(chunk) - stop, closed
        if rest:
            pieces.append(Piece(rest, False))
            self._segment_chars += rest_chars
        return pieces

    def flush(self) -> list[Piece]:
        """The caller asks to speak what it sent now (livekit's flush sentinel)."""
        held = "".join(self._held)
        self._reset()
        return [Piece(held, True)]

    def end(self) -> list[Piece]:
        """No more text: whatever was held back (the protocol's `end` speaks it)."""
        held = "".join(self._held)
        self._reset()
        return [Piece(held, False)] if held else []
