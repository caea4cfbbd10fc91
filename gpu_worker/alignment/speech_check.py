"""Is this audio speech at all? silero's VAD (silence_trim), per stream, until it hears some.

Warping audio onto a reference always yields a path, even for noise: the stand-in model's output
warped onto a sentence costs about what speech does (docs/alignment.md). silero tells them apart
at once (speech 0.85-0.93 of windows over 0.5, the stand-in's noise 0.00). Until speech is heard
the aligner holds its words; audio that never sounds like speech gets the estimate instead.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SpeechCheck", "SpeechChecks"]

SPEECH_PROBABILITY = 0.5
SPEECH_WINDOWS = 3  # windows of 32 ms over SPEECH_PROBABILITY that make it speech


class SpeechCheck:
    """`push(pcm)`; `heard` turns True once speech was heard, and stays."""

    def __init__(self, vad, sample_rate: int) -> None:  # noqa: ANN001 - silence_trim.vad.SileroVad
        from silence_trim.resample import BlockResampler
        from silence_trim.vad import SAMPLE_RATE as VAD_RATE

        self._resampler = BlockResampler(sample_rate, VAD_RATE)
        self._stream = vad.stream()
        self._windows = 0
        self.heard = False

    def push(self, pcm: np.ndarray) -> bool:
        if not self.heard:
            probabilities = self._stream.push(self._resampler.push(np.asarray(pcm, np.float32)))
            self._windows += int((probabilities > SPEECH_PROBABILITY).sum())
            self.heard = self._windows >= SPEECH_WINDOWS
        return self.heard


class SpeechChecks:
    """One silero session for a process; `new(sample_rate)` a check per piece of speech."""

    def __init__(self) -> None:
        from silence_trim.vad import SileroVad

        self._vad = SileroVad(threads=1)  # raises VadUnavailableError without the silero-vad wheel

    def new(self, sample_rate: int) -> SpeechCheck:
        return SpeechCheck(self._vad, sample_rate)
