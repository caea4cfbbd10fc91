"""Measuring leading and trailing silence of a whole clip, with either detector."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from silence_trim.energy import EnergyDetector, EnergyParams
from silence_trim.errors import InvalidOptionsError
from silence_trim.pcm import check_sample_rate, to_mono_float
from silence_trim.report import DETECTORS, DetectorName, Onset, SilenceReport
from silence_trim.vad import SileroVad
from silence_trim.vad_detector import VadDetector, VadParams


class Detector(Protocol):
    """One clip or stream under analysis: push mono float64 samples, ask where speech is."""

    name: DetectorName
    sample_rate: int

    @property
    def samples(self) -> int: ...

    def push(self, x: np.ndarray) -> None: ...

    def finish(self) -> None: ...

    def head(self) -> Onset: ...

    def span(self) -> tuple[int, int] | None: ...


def make_detector(
    detector: DetectorName,
    sample_rate: int,
    *,
    vad: SileroVad | None = None,
    energy_params: EnergyParams | None = None,
    vad_params: VadParams | None = None,
) -> Detector:
    """A fresh detector for one clip or stream. `detector="vad"` loads a SileroVad when none is given."""
    sample_rate = check_sample_rate(sample_rate)
    if detector == "energy":
        return EnergyDetector(sample_rate, energy_params)
    if detector == "vad":
        return VadDetector(vad if vad is not None else SileroVad(), sample_rate, vad_params)
    raise InvalidOptionsError(f"unknown detector {detector!r}: choose one of {', '.join(DETECTORS)}")


def measure(
    audio: np.ndarray,
    sample_rate: int,
    detector: DetectorName = "energy",
    *,
    vad: SileroVad | None = None,
    energy_params: EnergyParams | None = None,
    vad_params: VadParams | None = None,
    downmix: bool = False,
) -> SilenceReport:
    """Leading silence, trailing silence and speech span of a clip (int16/int32/float, any rate).

    Pass a SileroVad you keep when measuring many clips with detector="vad".
    """
    x = to_mono_float(audio, downmix=downmix)
    found = make_detector(detector, sample_rate, vad=vad, energy_params=energy_params, vad_params=vad_params)
    found.push(x)
    return SilenceReport.from_span(found.name, found.sample_rate, x.size, found.span())
