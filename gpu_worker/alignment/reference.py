"""What a piece of spoken text sounds like, word by word: espeak-ng's reading of it, as features,
with the frames each word starts and ends at. The aligner warps a voice's audio onto it.

Words are given as character spans of the text (the text front end's spoken words, tags left
out). espeak-ng reports where each of its words starts; a spoken word takes the first such start
inside its span, one it read as part of another word ("twenty-one" is one of its words) starts
with that one, and every word ends at the last voiced frame before the next one starts (a pause
after a comma belongs to no word).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpu_worker.alignment.espeak import Espeak, Spoken
from gpu_worker.alignment.features import HOP_S, features
from gpu_worker.text import SPOKEN_WORD

__all__ = ["Reference", "blank_tags", "reference_for", "spoken_spans", "voiced_ends", "word_starts"]

VOICED_DB = 35.0  # a frame this far below the loudest one so far is silence (the timer uses it too)


@dataclass(frozen=True, slots=True)
class Reference:
    text: str  # the spoken text it reads
    frames: np.ndarray  # (n, CEPSTRA) features
    spans: tuple[tuple[int, int], ...]  # per word, its characters in `text`
    starts: np.ndarray  # per word, its first frame
    ends: np.ndarray  # per word, one past its last voiced frame

    @property
    def duration_s(self) -> float:
        return len(self.frames) * HOP_S

    @property
    def words(self) -> list[str]:
        return [self.text[a:b] for a, b in self.spans]

    @property
    def count(self) -> int:
        return len(self.spans)


def spoken_spans(text: str) -> list[tuple[int, int]]:
    """The spans of `text`'s spoken words, tags left out (for text that did not come with them)."""
    return [m.span() for m in SPOKEN_WORD.finditer(text) if not m[0].startswith("<")]


def blank_tags(text: str) -> str:
    """`text` with every tag replaced by as many spaces (character positions stay)."""
    return SPOKEN_WORD.sub(lambda m: " " * len(m[0]) if m[0].startswith("<") else m[0], text)


def word_starts(spans: Sequence[tuple[int, int]], spoken: Spoken) -> np.ndarray:
    """Per word span, the sample espeak-ng's reading of it starts at."""
    starts = np.full(len(spans), -1, np.int64)
    firsts = [a for a, _ in spans]
    for event in spoken.words:
        if event.length <= 0:  # clause markers
            continue
        i = bisect.bisect_right(firsts, event.start) - 1  # the span it would fall in (spans are in order)
        if i >= 0 and event.start < spans[i][1] and starts[i] < 0:
            starts[i] = event.sample
    last = 0
    for i, s in enumerate(starts):  # a word with no start of its own starts with the one before
        last = max(last, int(s))
        starts[i] = last
    return starts


def reference_for(text: str, espeak: Espeak, spans: Sequence[tuple[int, int]] | None = None, *,
                  voice: str = "en-us", wpm: int = 175) -> Reference:
    """espeak-ng's reading of `text` (tags blanked out), timed at each of `spans` (default: its words)."""
    spans = tuple(spans if spans is not None else spoken_spans(text))
    spoken = espeak.speak(blank_tags(text), voice=voice, wpm=wpm)
    frames, levels = features(spoken.pcm, spoken.sample_rate)
    n = len(frames)
    if n == 0:
        raise ValueError(f"espeak-ng read no audio for {text!r}")
    starts = np.minimum(word_starts(spans, spoken) * 1.0 / spoken.sample_rate / HOP_S, n - 1).astype(np.int64)
    return Reference(text, frames, spans, starts, voiced_ends(starts, levels))


def voiced_ends(starts: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Per word starting at frame `starts[i]`, one past its last voiced frame before the next word
    starts (the bench's truth ends are made the same way, from the test speech's levels)."""
    n = len(levels)
    voiced = levels > levels.max() - VOICED_DB
    ends = np.empty_like(starts)
    for i, start in enumerate(starts):
        limit = starts[i + 1] if i + 1 < len(starts) else n
        span = np.flatnonzero(voiced[start:max(start + 1, limit)])
        ends[i] = start + (span[-1] + 1 if len(span) else max(1, limit - start))
    return np.minimum(ends, n)
