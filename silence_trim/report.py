"""Result types shared by the detectors, the trimmers and the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

DetectorName = Literal["energy", "vad"]
DETECTORS: tuple[DetectorName, ...] = ("energy", "vad")


@dataclass(frozen=True)
class Onset:
    """What a detector knows so far about where speech starts, in samples of the input.

    start: first speech sample once the detector has confirmed speech, else None.
    horizon: no speech will be placed before this sample, whatever audio comes next
        (equals `start` once confirmed; equals the samples seen when the stream has ended
        without speech).
    """

    start: int | None
    horizon: int


@dataclass(frozen=True)
class SilenceReport:
    """Leading and trailing silence of one clip.

    With no speech at all, `has_speech` is False, both silences equal the whole duration and
    `speech_ms` is 0. `speech_ms` spans first to last speech sample, pauses included.
    """

    detector: DetectorName
    sample_rate: int
    duration_ms: float
    leading_silence_ms: float
    trailing_silence_ms: float
    speech_ms: float
    has_speech: bool
    speech_start: int | None  # first speech sample
    speech_end: int | None  # one past the last speech sample

    @classmethod
    def from_span(
        cls, detector: DetectorName, sample_rate: int, samples: int, span: tuple[int, int] | None
    ) -> SilenceReport:
        def ms(n: int) -> float:
            return round(1000.0 * n / sample_rate, 3)

        if span is None:
            return cls(detector, sample_rate, ms(samples), ms(samples), ms(samples), 0.0, False, None, None)
        start, end = span
        return cls(detector, sample_rate, ms(samples), ms(start), ms(samples - end), ms(end - start), True, start, end)

    def to_dict(self) -> dict:
        return asdict(self)
