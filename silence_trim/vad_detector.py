"""The VAD detector: the silero model decides where speech is, frame levels place its edges.

Silero hears speech through noise that defeats any level threshold, but it decides per 32 ms
window and fires late on soft onsets (a leading "sh" is often 60-90 ms ahead of its first
confident window). So the model's first confirmed speech run (hysteresis on probabilities, as
silero's own timestamp code does) only places speech coarsely; its edges are then placed on
5 ms frame levels relative to the noise floor (see edges.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from silence_trim import vad as silero
from silence_trim.edges import EdgeFrames, EdgeParams, noise_floor, refine_end, refine_start
from silence_trim.errors import InvalidOptionsError
from silence_trim.hysteresis import first_confirmed_run, run_end, run_start
from silence_trim.levels import LevelMeter, frame_length
from silence_trim.report import DetectorName, Onset
from silence_trim.resample import BlockResampler
from silence_trim.series import Series


@dataclass(frozen=True)
class VadParams:
    """Thresholds of the VAD detector."""

    threshold: float = 0.5  # a window this likely to be speech triggers it
    neg_threshold: float = 0.35  # windows this likely keep speech going (silero: threshold - 0.15)
    quiet_threshold: float = 0.15  # windows below this are surely not speech: the noise floor is measured on them
    min_speech_ms: float = 96.0  # speech windows needed after a trigger to confirm it
    confirm_window_ms: float = 256.0  # ... within this long after the trigger
    frame_ms: float = 5.0  # level frames used to place the edges
    edges: EdgeParams = field(default_factory=EdgeParams)

    def __post_init__(self) -> None:
        if not 0.0 <= self.quiet_threshold <= self.neg_threshold <= self.threshold < 1.0:
            raise InvalidOptionsError(
                f"need 0 <= quiet_threshold ({self.quiet_threshold}) <= neg_threshold ({self.neg_threshold}) "
                f"<= threshold ({self.threshold}) < 1"
            )
        if self.min_speech_ms <= 0 or self.confirm_window_ms < self.min_speech_ms:
            raise InvalidOptionsError(
                f"need 0 < min_speech_ms ({self.min_speech_ms}) <= confirm_window_ms ({self.confirm_window_ms})"
            )
        if not 0.5 <= self.frame_ms <= 32:
            raise InvalidOptionsError(f"frame_ms must be within 0.5..32 ms, got {self.frame_ms}")


class VadDetector:
    """Incremental VAD detector for one clip or stream (the model session is shared, the state is not)."""

    name: DetectorName = "vad"

    def __init__(self, model: silero.SileroVad, sample_rate: int, params: VadParams | None = None) -> None:
        self.sample_rate = sample_rate
        self.params = params or VadParams()
        self.frame_len = frame_length(sample_rate, self.params.frame_ms)
        self._window_len = silero.WINDOW * sample_rate / silero.SAMPLE_RATE  # native samples per window
        window_ms = 1000.0 * silero.WINDOW / silero.SAMPLE_RATE
        self._min_active = max(1, round(self.params.min_speech_ms / window_ms))
        self._window = max(self._min_active, round(self.params.confirm_window_ms / window_ms))
        self._edge = EdgeFrames.of(self.params.edges, 1000.0 * self.frame_len / sample_rate)
        self._meter = LevelMeter(self.frame_len)
        self._resampler = BlockResampler(sample_rate, silero.SAMPLE_RATE)
        self._model = model.stream()
        self._levels = Series()
        self._probs = Series()
        self._samples = 0
        self._final = False

    @property
    def samples(self) -> int:
        return self._samples

    def push(self, x: np.ndarray) -> None:
        """Feed mono float64 samples."""
        self._levels.extend(self._meter.push(x))
        self._probs.extend(self._model.push(self._resampler.push(x)))
        self._samples += x.size

    def finish(self) -> None:
        """The input has ended: flush the resampler and the last partial window and frame."""
        if not self._final:
            self._levels.extend(self._meter.finish())
            self._probs.extend(self._model.push(self._resampler.finish()))
            self._probs.extend(self._model.finish())
            self._final = True

    @property
    def probabilities(self) -> np.ndarray:
        return self._probs.values

    @property
    def levels(self) -> np.ndarray:
        return self._levels.values

    def _search(self, probs: np.ndarray, final: bool):
        return first_confirmed_run(
            probs >= self.params.threshold, probs >= self.params.neg_threshold,
            min_active=self._min_active, window=self._window, final=final,
        )

    def _quiet_levels(self, begin: int, end: int) -> np.ndarray:
        """Levels of the frames in [begin, end) whose window the model is sure holds no speech
        (their order is kept, gaps closed)."""
        probs = self._probs.values
        frames = np.arange(begin, end)
        window = ((frames + 0.5) * self.frame_len / self._window_len).astype(np.int64)  # window of each frame centre
        known = window < probs.size
        quiet = np.zeros(frames.size, dtype=bool)
        quiet[known] = probs[window[known]] < self.params.quiet_threshold
        return self._levels.values[begin:end][quiet]

    def head(self) -> Onset:
        """Where speech starts, as far as the samples pushed so far tell (prefix-stable)."""
        found = self._search(self._probs.values, self._final)
        if found.start is None:
            if self._final:
                return Onset(start=None, horizon=self._samples)
            frame = int(found.horizon * self._window_len) // self.frame_len - self._edge.lookback
            return Onset(start=None, horizon=min(max(frame, 0) * self.frame_len, self._samples))
        coarse = round(found.start * self._window_len) // self.frame_len
        sure = round((found.trigger + 1) * self._window_len) // self.frame_len
        floor = noise_floor(self._quiet_levels(0, coarse))
        start = min(refine_start(self._levels.values, coarse, sure, floor, self._edge) * self.frame_len, self._samples)
        return Onset(start=start, horizon=start)

    def span(self) -> tuple[int, int] | None:
        """First speech sample and one past the last, after finish(); None when there is no speech."""
        self.finish()
        start = self.head().start
        if start is None:
            return None
        probs = self._probs.values
        active = probs >= self.params.neg_threshold
        first = self._search(probs, final=True)
        last = self._search(probs[::-1], final=True)  # the same search, from the end
        if last.start is not None:
            end_window, trigger = probs.size - last.start, probs.size - 1 - last.trigger
        else:  # the last confirmed run only confirms forwards
            end_window, trigger = run_end(active, first.trigger), first.trigger
        coarse_end = -(-round(end_window * self._window_len) // self.frame_len)  # frames, rounded up
        # the edge is anchored anywhere in the last run (offline: its whole extent is known)
        sure = round(run_start(active, trigger) * self._window_len) // self.frame_len
        coarse_end = min(coarse_end, self._levels.values.size)
        floor = noise_floor(self._quiet_levels(coarse_end, self._samples // self.frame_len))
        end = refine_end(self._levels.values, coarse_end, sure, floor, self._edge)
        return start, max(min(end * self.frame_len, self._samples), start)
