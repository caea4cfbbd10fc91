"""The energy detector: speech is where detrended frame levels rise above absolute thresholds.

Cheap (a few multiply-adds per sample, no model) and exact to a frame (5 ms), it is the detector
for clean audio: TTS output and studio recordings whose noise floor sits below `off_db`. Above
that floor every frame looks active and it finds no silence to remove (it never cuts speech;
it just stops helping): use the VAD detector for noisy recordings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from silence_trim.edges import EdgeFrames, EdgeParams, noise_floor, refine_end, refine_start
from silence_trim.errors import InvalidOptionsError
from silence_trim.hysteresis import first_confirmed_run, run_end, run_start
from silence_trim.levels import LevelMeter, frame_length
from silence_trim.report import DetectorName, Onset
from silence_trim.series import Series


@dataclass(frozen=True)
class EnergyParams:
    """Thresholds of the energy detector (levels in dBFS of detrended frame RMS)."""

    frame_ms: float = 5.0
    on_db: float = -40.0  # a frame this loud triggers speech
    off_db: float = -55.0  # frames this loud keep speech going, and extend its start back
    min_speech_ms: float = 40.0  # active audio needed after a trigger to confirm it
    confirm_window_ms: float = 200.0  # ... within this long after the trigger
    edges: EdgeParams = field(default_factory=EdgeParams)  # then the edges move out over softer audio

    def __post_init__(self) -> None:
        if not 0.5 <= self.frame_ms <= 100:
            raise InvalidOptionsError(f"frame_ms must be within 0.5..100 ms, got {self.frame_ms}")
        if self.off_db >= self.on_db:
            raise InvalidOptionsError(f"off_db ({self.off_db}) must be below on_db ({self.on_db})")
        if self.min_speech_ms <= 0 or self.confirm_window_ms < self.min_speech_ms:
            raise InvalidOptionsError(
                f"need 0 < min_speech_ms ({self.min_speech_ms}) <= confirm_window_ms ({self.confirm_window_ms})"
            )


class EnergyDetector:
    """Incremental energy detector for one clip or stream: push samples, then ask where speech starts."""

    name: DetectorName = "energy"

    def __init__(self, sample_rate: int, params: EnergyParams | None = None) -> None:
        self.sample_rate = sample_rate
        self.params = params or EnergyParams()
        self.frame_len = frame_length(sample_rate, self.params.frame_ms)
        frame_ms = 1000.0 * self.frame_len / sample_rate
        self._min_active = max(1, round(self.params.min_speech_ms / frame_ms))
        self._window = max(self._min_active, round(self.params.confirm_window_ms / frame_ms))
        self._edge = EdgeFrames.of(self.params.edges, frame_ms)
        self._meter = LevelMeter(self.frame_len)
        self._levels = Series()
        self._samples = 0
        self._final = False

    @property
    def samples(self) -> int:
        return self._samples

    def push(self, x: np.ndarray) -> None:
        """Feed mono float64 samples."""
        self._levels.extend(self._meter.push(x))
        self._samples += x.size

    def finish(self) -> None:
        """The input has ended: measure the last partial frame and stop waiting for more."""
        if not self._final:
            self._levels.extend(self._meter.finish())
            self._final = True

    @property
    def levels(self) -> np.ndarray:
        return self._levels.values

    def _search(self, levels: np.ndarray, final: bool):
        return first_confirmed_run(
            levels >= self.params.on_db, levels >= self.params.off_db,
            min_active=self._min_active, window=self._window, final=final,
        )

    def head(self) -> Onset:
        """Where speech starts, as far as the samples pushed so far tell (prefix-stable)."""
        lv = self._levels.values
        found = self._search(lv, self._final)
        if found.start is not None:
            floor = noise_floor(lv[: found.start])
            start = refine_start(lv, found.start, found.trigger + 1, floor, self._edge) * self.frame_len
            return Onset(start=start, horizon=start)
        if self._final:
            return Onset(start=None, horizon=self._samples)
        horizon = max(found.horizon - self._edge.lookback, 0) * self.frame_len
        return Onset(start=None, horizon=min(horizon, self._samples))

    def span(self) -> tuple[int, int] | None:
        """First speech sample and one past the last, after finish(); None when there is no speech."""
        self.finish()
        start = self.head().start
        if start is None:
            return None
        lv = self._levels.values
        first = self._search(lv, final=True)
        last = self._search(lv[::-1], final=True)  # the same search, from the end
        active = lv >= self.params.off_db
        if last.start is not None:
            coarse_end, trigger = lv.size - last.start, lv.size - 1 - last.trigger
        else:  # the last confirmed run only confirms forwards
            coarse_end, trigger = run_end(active, first.trigger), first.trigger
        whole = self._samples // self.frame_len  # the floor is measured on whole frames only
        floor = noise_floor(lv[coarse_end:whole])
        end = refine_end(lv, coarse_end, run_start(active, trigger), floor, self._edge) * self.frame_len
        return start, max(min(end, self._samples), start)
