"""Word times for one piece of speech as its audio streams in, each sent once and never revised.

The audio is warped onto the text's reference reading (`StreamingDtw`) as it arrives. A word is
timed once the best alignment so far has passed its reference end by `settle_s`: from then on
later audio rarely moves it, so its time is final when sent, and it is sent about a word plus
`settle_s` after its audio. The rest are timed when the piece ends, on the whole alignment.

Audio that is not speech (the stand-in model's noise) has no words to find: with a
`SpeechCheck`, nothing is sent until speech is heard, and audio that never sounds like speech
gets the reference's timing stretched to its length instead (each word flagged `estimated`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_worker.alignment.dtw import StreamingDtw
from gpu_worker.alignment.features import HOP_S, FeatureStream
from gpu_worker.alignment.reference import VOICED_DB, Reference
from gpu_worker.alignment.speech_check import SpeechCheck

__all__ = ["WordTime", "WordTimer"]

_PRIOR_FRAMES = 100  # the reference's mean counts as this many frames of the audio's running mean
_SLACK_FRAMES = 100  # columns kept before the last timed word's start, for paths that reroute
_PAUSE_FRAMES = 8  # quiet frames at a word's warped start that make a pause, not a soft onset (bench: 80 ms best)


@dataclass(frozen=True, slots=True)
class WordTime:
    index: int  # the word's number in the reference (spoken words, tags excluded)
    start_s: float  # from the piece's first sample
    end_s: float
    estimated: bool = False  # stretched from the reference, not aligned


class WordTimer:
    """`push(pcm)` -> words it timed; `finish()` -> the rest. One per spoken piece."""

    def __init__(self, reference: Reference, sample_rate: int, *, check: SpeechCheck | None = None,
                 settle_s: float = 0.25, every_s: float = 0.1) -> None:
        self.reference = reference
        self.sample_rate = sample_rate
        self.settle = int(round(settle_s / HOP_S))
        self.every = max(1, int(round(every_s / HOP_S)))
        self._check = check
        self._stream = FeatureStream(sample_rate)
        mean = reference.frames.mean(axis=0)
        self._scale = reference.frames.std(axis=0) + 1e-3
        self._sum, self._count = mean * _PRIOR_FRAMES, _PRIOR_FRAMES
        self._dtw = StreamingDtw((reference.frames - mean) / self._scale)
        self._levels: list[float] = []  # per test frame, its level (dB)
        self._loudest = -120.0
        self._since_check = 0
        self._sent = 0  # words timed so far (always the first ones)
        self._floor = 0.0  # the last timed word's end: no later word starts before it (none overlap)
        self._last_start = 0.0  # the last timed word's start: the warping keeps columns from before it
        self.samples = 0

    def push(self, pcm: np.ndarray) -> list[WordTime]:
        self.samples += len(pcm)
        if self._check is not None:
            self._check.push(pcm)
        frames, levels = self._stream.push(pcm)
        self._levels.extend(levels.tolist())
        if len(levels):
            self._loudest = max(self._loudest, float(levels.max()))
        for frame in frames:  # normalized by the audio's running mean (its level, its timbre)
            self._sum = self._sum + frame
            self._count += 1
            self._dtw.push(((frame - self._sum / self._count) / self._scale)[None, :])
        self._since_check += len(frames)
        if self._since_check < self.every or (self._check is not None and not self._check.heard):
            return []
        self._since_check = 0
        end = self._dtw.best_end()
        ready = self._sent
        while ready < self.reference.count and self.reference.ends[ready] + self.settle <= end:
            ready += 1
        return self._time(ready, end) if ready > self._sent else []

    def finish(self) -> list[WordTime]:
        """The words not yet timed: on the whole alignment, or stretched when no speech was heard."""
        if self._sent >= self.reference.count:
            return []
        if self._dtw.frames == 0 or (self._check is not None and not self._check.heard):
            return self._stretched()
        return self._time(self.reference.count, len(self.reference.frames) - 1)

    def _time(self, upto: int, end: int) -> list[WordTime]:
        ref = self.reference
        first = self._dtw.path(end, floor=int(ref.starts[self._sent]))
        out = []
        for i in range(self._sent, upto):
            start_frame, end_frame = first[min(ref.starts[i], end)], first[min(ref.ends[i], end)]
            start_frame = self._voiced_from(start_frame, end_frame)
            start = max(self._floor, start_frame * HOP_S)
            stop = max(start, end_frame * HOP_S)
            start, stop = round(float(start), 3), round(float(stop), 3)
            out.append(WordTime(i, start, stop))
            self._floor, self._last_start = stop, start
        self._sent = upto
        self._dtw.forget_before(int(self._last_start / HOP_S) - _SLACK_FRAMES)
        return out

    def _voiced_from(self, start: int, end: int) -> int:
        """A word's first voiced frame from `start` on (before `end`): a pause the warping gave to
        the word's start (the reference has none there) is not the word."""
        quiet = self._loudest - VOICED_DB
        for frame in range(start, min(end, len(self._levels))):
            if self._levels[frame] > quiet:
                return frame if frame - start >= _PAUSE_FRAMES else start
        return start

    def _stretched(self) -> list[WordTime]:
        ref = self.reference
        scale = (self.samples / self.sample_rate) / max(ref.duration_s, HOP_S)
        out = []
        for i in range(self._sent, ref.count):
            start = float(max(self._floor, ref.starts[i] * HOP_S * scale))
            end = float(max(start, ref.ends[i] * HOP_S * scale))
            start, end = round(start, 3), round(end, 3)
            out.append(WordTime(i, start, end, estimated=True))
            self._floor = end
        self._sent = ref.count
        return out
