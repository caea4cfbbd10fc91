"""The caller's own words, timed: spoken-word times mapped back through the text front end.

A written word read as several spoken words ("$5" is "five dollars", "3:30pm" is "three thirty
p m") is one timed word with the caller's text, from its first spoken word's start to its last
one's end, sent once its last spoken word is timed. Tags (`<laugh>`) are not words.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_worker.alignment.reference import spoken_spans
from gpu_worker.text import Normalized

__all__ = ["CallerWords", "TimedWord", "WordGroup"]


@dataclass(frozen=True, slots=True)
class TimedWord:
    text: str  # as the caller wrote it
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class WordGroup:
    """One caller word and the spoken words it was read as."""

    text: str
    first: int  # spoken word numbers (tags left out), both ends included
    last: int


class CallerWords:
    """`spans` for the reference; `push(index, start_s, end_s)` per timed spoken word, in order."""

    def __init__(self, text: str, spans: list[tuple[int, int]], groups: list[WordGroup]) -> None:
        self.text = text  # what the voice reads (the prompt's text)
        self.spans = spans  # the spoken words' spans in `text`, tags left out
        self.groups = groups
        self._next = 0  # the group being timed
        self._start: float | None = None

    @classmethod
    def of(cls, normalized: Normalized) -> CallerWords:
        """The words of `normalized` (the text front end's reading of the caller's text)."""
        spoken = [w for w in normalized.words if not w.text.startswith("<")]
        groups: list[WordGroup] = []
        for i, word in enumerate(spoken):
            key = (word.written_start, word.written_end)
            if i and key == (spoken[i - 1].written_start, spoken[i - 1].written_end):
                groups[-1] = WordGroup(groups[-1].text, groups[-1].first, i)
            else:
                groups.append(WordGroup(normalized.written[key[0]:key[1]], i, i))
        return cls(normalized.text, [(w.start, w.end) for w in spoken], groups)

    @classmethod
    def verbatim(cls, text: str) -> CallerWords:
        """Text spoken as written (the caller normalizes it): each spoken word is a caller word."""
        spans = spoken_spans(text)
        return cls(text, spans, [WordGroup(text[a:b], i, i) for i, (a, b) in enumerate(spans)])

    def rest(self, at_s: float) -> list[TimedWord]:
        """The words no spoken time completed (a piece whose words the request text cut differently),
        each at `at_s`, so every word of the text is sent."""
        out = [TimedWord(g.text, self._start if self._start is not None and i == self._next else at_s, at_s)
               for i, g in enumerate(self.groups[self._next:], start=self._next)]
        self._next, self._start = len(self.groups), None
        return out

    def push(self, timed: Iterable[tuple[int, float, float]]) -> list[TimedWord]:
        """(spoken word number, start_s, end_s), numbers in order -> the caller's words they complete."""
        out = []
        for index, start_s, end_s in timed:
            while self._next < len(self.groups) and self.groups[self._next].last < index:
                self._next += 1  # a word no time reached (not expected: every spoken word is timed)
                self._start = None
            if self._next == len(self.groups):
                break
            group = self.groups[self._next]
            if self._start is None:
                self._start = start_s
            if index == group.last:
                out.append(TimedWord(group.text, self._start, max(self._start, end_s)))
                self._next += 1
                self._start = None
        return out
