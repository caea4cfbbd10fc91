"""Fixtures for the silence_trim tests: espeak-ng speech with known head silence.

Truth, precisely: the speech of a clean clip spans from its first to its last sample whose
magnitude reaches -60 dBFS (`speech_edges`); espeak-ng itself leaves ~12 ms of digital silence
before that and ~300 ms after. A case pads the clip with `head_ms` of digital silence (and
`tail_ms` after), then adds a noise floor over the whole of it. So the true leading silence is
head_ms + first_edge / sr and the true trailing silence is tail_ms + (len(clip) - 1 - last_edge) / sr.
Under a noise floor, the speech that must survive trimming is what stands 15 dB above the noise
RMS (a -45 dBFS floor buries the -60 dBFS decay of a final consonant); DC and hum bury nothing
the detectors can hear (both measure levels with them removed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tests.fixtures.speech import SAMPLE_RATE, hum, pad_silence, speech_edges, white_noise

PADS_MS = (0, 100, 600, 1500)
# name -> (kind, level): white noise RMS dBFS, 50 Hz hum RMS dBFS, DC offset
NOISES = {
    "clean": None,
    "white-60": ("white", -60.0),
    "white-45": ("white", -45.0),
    "hum-30": ("hum", -30.0),
    "dc": ("dc", 0.05),
}


@dataclass(frozen=True)
class Case:
    """A padded (and maybe noisy) clip with the truth about its speech."""

    clip: np.ndarray  # the clean unpadded int16 clip
    audio: np.ndarray  # what the detector sees: int16 when clean, else float64
    head_ms: float
    tail_ms: float
    noise: str
    sample_rate: int = SAMPLE_RATE

    @property
    def must_keep_dbfs(self) -> float:
        level = NOISES[self.noise]
        return -60.0 if level is None or level[0] != "white" else max(-60.0, level[1] + 15.0)

    @property
    def speech(self) -> tuple[int, int]:
        """First and last sample (in `audio`) of the speech that must be kept."""
        first, last = speech_edges(self.clip, self.must_keep_dbfs)
        head = round(self.head_ms * self.sample_rate / 1000)
        return head + first, head + last

    @property
    def leading_ms(self) -> float:
        return self.head_ms + 1000.0 * speech_edges(self.clip)[0] / self.sample_rate

    @property
    def trailing_ms(self) -> float:
        return self.tail_ms + 1000.0 * (self.clip.size - 1 - speech_edges(self.clip)[1]) / self.sample_rate

    @property
    def label(self) -> str:
        return f"head={self.head_ms:g}ms tail={self.tail_ms:g}ms noise={self.noise}"


def make_case(clip: np.ndarray, head_ms: float, noise: str = "clean", tail_ms: float = 0.0, seed: int = 0) -> Case:
    padded = pad_silence(clip, SAMPLE_RATE, head_ms, tail_ms)
    level = NOISES[noise]
    if level is None:
        return Case(clip, padded, head_ms, tail_ms, noise)
    audio = padded.astype(np.float64) / 32768.0
    kind, value = level
    if kind == "white":
        audio += white_noise(audio.size, value, seed=seed)
    elif kind == "hum":
        audio += hum(audio.size, SAMPLE_RATE, value)
    else:
        audio += value
    return Case(clip, audio, head_ms, tail_ms, noise)


@pytest.fixture(scope="session")
def vad():
    """One silero session for the whole test session (as a worker or trainer would hold one)."""
    from silence_trim import SileroVad

    return SileroVad()


@pytest.fixture(scope="session")
def clips(speech_corpus) -> list[np.ndarray]:
    """int16 samples of all corpus clips (both voices, alternating)."""
    return [clip.load() for clip in speech_corpus]


@pytest.fixture(scope="session")
def clip(clips) -> np.ndarray:
    """One clip: 'Glue the sheet to the dark blue background.' in the en+f3 voice."""
    return clips[1]
