"""Dropping head-of-line silence from a live PCM stream (the worker's 24 kHz PCM16 output).

`StreamTrimmer` holds back the start of a stream until the detector confirms speech, then emits
the held audio from `margin_ms` before the speech (faded in) and passes every later chunk
through untouched, as the same object, at no cost. It is bounded: it never drops more than
`max_drop_ms` (a quiet voice loses at most that, never the rest of its stream) and never holds
more than `max_hold_ms` (then it passes audio on, dropping only what is certainly silence).

Its output is a function of the stream's samples alone, whatever their chunking, and equals the
offline `trim(..., TrimOptions(tail=False))` of the same audio whenever speech starts within
`max_drop_ms + margin_ms`. push() is synchronous and cheap: call it from the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from silence_trim.detect import make_detector
from silence_trim.energy import EnergyParams
from silence_trim.errors import ChannelLayoutError, InvalidAudioError, InvalidOptionsError, StreamClosedError
from silence_trim.pcm import apply_fade, check_audio, check_sample_rate, to_mono_float
from silence_trim.report import DetectorName
from silence_trim.trim import check_margins, ms_to_samples
from silence_trim.vad import SileroVad
from silence_trim.vad_detector import VadParams

Chunk = bytes | bytearray | memoryview | np.ndarray
Outcome = Literal["speech", "max_drop", "max_hold", "end_of_stream"]
_PCM16 = np.dtype("<i2")


@dataclass(frozen=True)
class StreamOptions:
    """How a stream is gated. One SNAC frame is 2048 samples (85 ms) at 24 kHz."""

    detector: DetectorName = "energy"
    margin_ms: float = 20.0
    fade_ms: float = 5.0
    max_drop_ms: float = 1500.0  # never drop more than this
    max_hold_ms: float = 2000.0  # never hold back more than this
    energy_params: EnergyParams = field(default_factory=EnergyParams)
    vad_params: VadParams = field(default_factory=VadParams)

    def __post_init__(self) -> None:
        check_margins(self.margin_ms, self.fade_ms)
        if self.max_drop_ms < 0:
            raise InvalidOptionsError(f"max_drop_ms must be >= 0, got {self.max_drop_ms}")
        if self.max_hold_ms <= 0 or self.max_hold_ms < self.max_drop_ms + self.margin_ms:
            raise InvalidOptionsError(
                f"max_hold_ms ({self.max_hold_ms}) must be positive and at least max_drop_ms + margin_ms "
                f"({self.max_drop_ms + self.margin_ms})"
            )


@dataclass(frozen=True)
class HeadDrop:
    """What the trimmer did at the head of its stream.

    outcome: "speech" (cut `margin_ms` before speech), "max_drop" (speech or certain silence lay
    beyond max_drop_ms: dropped exactly that), "max_hold" (gave up waiting: dropped only what was
    certainly silence), "end_of_stream" (the stream ended before any speech).
    released_at_ms: stream position when the first audio went out (the added first-packet delay
    is released_at_ms - dropped_ms).
    speech_start_ms: where speech starts, when it was confirmed before the release.
    outcome and dropped_* depend only on the audio; released_at_ms and speech_start_ms also on
    where the chunks happened to end.
    """

    outcome: Outcome
    dropped_ms: float
    dropped_samples: int
    released_at_ms: float
    speech_start_ms: float | None
    detector: DetectorName


class StreamTrimmer:
    """Per-stream head-silence gate. Push chunks (PCM16 bytes or a 1-D array), get audio back.

    The output of each push has the kind of the input (bytes, or an array of the same dtype) and
    is empty while the head is held back.
    """

    def __init__(
        self, sample_rate: int = 24000, options: StreamOptions | None = None, *, vad: SileroVad | None = None
    ) -> None:
        self.sample_rate = check_sample_rate(sample_rate)
        self.options = options or StreamOptions()
        if self.options.detector == "vad" and vad is None:
            raise InvalidOptionsError(
                "detector='vad' needs a SileroVad: build one at start-up and pass vad=... to every stream"
            )
        self._detector = make_detector(
            self.options.detector, self.sample_rate, vad=vad,
            energy_params=self.options.energy_params, vad_params=self.options.vad_params,
        )
        self._margin = ms_to_samples(self.options.margin_ms, self.sample_rate)
        self._fade = ms_to_samples(self.options.fade_ms, self.sample_rate)
        self._max_drop = ms_to_samples(self.options.max_drop_ms, self.sample_rate)
        self._max_hold = max(1, ms_to_samples(self.options.max_hold_ms, self.sample_rate))
        self._kind: np.dtype | None = None  # dtype of the samples; bytes streams are PCM16
        self._is_bytes = False
        self._carry = b""  # a PCM16 byte split across two pushes
        self._held: list[np.ndarray] = []
        self._held_samples = 0
        self._result: HeadDrop | None = None
        self._closed = False

    @property
    def passing(self) -> bool:
        """True once the head has been released: every later chunk passes through unchanged."""
        return self._result is not None

    @property
    def result(self) -> HeadDrop | None:
        """What was dropped at the head, once released."""
        return self._result

    def push(self, chunk: Chunk) -> bytes | np.ndarray:
        """Feed the next chunk; returns the audio that may be sent on now."""
        if self._closed:
            raise StreamClosedError("this stream was flushed: start a new StreamTrimmer for a new stream")
        self._check_kind(chunk)
        if self.passing:
            return chunk if not isinstance(chunk, (bytearray, memoryview)) else bytes(chunk)
        samples = self._samples_of(chunk)
        out: list[np.ndarray] = []
        start = 0
        while start < samples.size and not self.passing:
            part = samples[start : start + self._max_hold - self._held_samples]
            start += part.size
            self._hold(part)
            if self.passing:
                out.append(self._released)
        if start < samples.size:
            out.append(samples[start:])
        return self._emit(out)

    def flush(self) -> bytes | np.ndarray:
        """End of stream: release whatever is still held (no speech: all but max_drop_ms is dropped)."""
        if self._closed:
            return self._emit([])
        self._closed = True
        if self.passing:
            return self._emit([])
        self._detector.finish()
        onset = self._detector.head()
        if onset.start is not None:
            self._release_at(onset.start)
        else:
            self._release(min(max(onset.horizon - self._margin, 0), self._max_drop), "end_of_stream", None)
        return self._emit([self._released])

    # -- holding ---------------------------------------------------------------------------

    def _hold(self, part: np.ndarray) -> None:
        self._held.append(part)
        self._held_samples += part.size
        self._detector.push(to_mono_float(part))
        onset = self._detector.head()
        if onset.start is not None:
            self._release_at(onset.start)
        elif onset.horizon - self._margin > self._max_drop:  # any speech found later would be cut at max_drop
            self._release(self._max_drop, "max_drop", None)
        elif self._held_samples >= self._max_hold:
            self._release(min(max(onset.horizon - self._margin, 0), self._max_drop), "max_hold", None)

    def _release_at(self, speech_start: int) -> None:
        wanted = max(speech_start - self._margin, 0)
        self._release(min(wanted, self._max_drop), "speech" if wanted <= self._max_drop else "max_drop", speech_start)

    def _release(self, cut: int, outcome: Outcome, speech_start: int | None) -> None:
        held = np.concatenate(self._held) if self._held else np.zeros(0, dtype=self._kind or _PCM16)
        released = held[cut:]
        self._released = apply_fade(released, self._fade, rising=True) if cut > 0 else released
        ms = 1000.0 / self.sample_rate
        self._result = HeadDrop(
            outcome=outcome,
            dropped_ms=round(cut * ms, 3),
            dropped_samples=cut,
            released_at_ms=round(self._held_samples * ms, 3),
            speech_start_ms=None if speech_start is None else round(speech_start * ms, 3),
            detector=self._detector.name,
        )
        self._held, self._detector = [], None  # the detector's history is no longer needed

    # -- chunk kinds -----------------------------------------------------------------------

    def _check_kind(self, chunk: Chunk) -> None:
        is_bytes = isinstance(chunk, (bytes, bytearray, memoryview))
        if not is_bytes and not isinstance(chunk, np.ndarray):
            raise InvalidAudioError(f"push PCM16 bytes or a numpy array, got {type(chunk).__name__}")
        dtype = _PCM16 if is_bytes else chunk.dtype
        if self._kind is None:
            self._kind, self._is_bytes = dtype, is_bytes
        elif is_bytes != self._is_bytes or dtype != self._kind:
            first = "PCM16 bytes" if self._is_bytes else f"{self._kind} arrays"
            raise InvalidAudioError(f"this stream started with {first}: push one kind of chunk per stream")
        if not is_bytes and chunk.ndim != 1:
            raise ChannelLayoutError(f"stream chunks must be mono 1-D arrays, got shape {chunk.shape}")

    def _samples_of(self, chunk: Chunk) -> np.ndarray:
        if not self._is_bytes:
            return check_audio(chunk)
        data = self._carry + bytes(chunk)
        whole = len(data) // 2 * 2
        self._carry = data[whole:]
        return np.frombuffer(data[:whole], dtype=_PCM16)

    def _emit(self, parts: list[np.ndarray]) -> bytes | np.ndarray:
        kind = self._kind or _PCM16
        if not self._is_bytes and self._kind is not None:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=kind)
        data = b"".join(p.astype(_PCM16, copy=False).tobytes() for p in parts)
        if self.passing and self._carry:
            data, self._carry = data + self._carry, b""
        return data
