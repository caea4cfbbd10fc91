"""The room and the microphone a recording was made with, from the recording alone: how reverberant
it is (`reverb_s`, an RT60-style decay time) and its long-term spectrum (`spectrum_db`, the
microphone's and the room's colour, the voice's own in it too): `RoomProfile.differs_from` says
when two recordings (the consent recording and the uploads) sound like different rooms or
microphones. Pure numpy, 24 kHz mono float.

Why a decay time can be read from speech: every time the voice stops, the room keeps ringing, and
the level falls at 60 / RT60 dB per second; speech stops many times. The level is read in 10 ms
frames; every 250 ms stretch that starts near the speech's loud level and falls by 8 dB or more is
a decay; the steepest of them (the 5th percentile of slopes) are the room's free decays (a slower
fall is the voice fading, not the room), so RT60 = -60 / that slope. Measured against a known
truth (espeak-ng speech convolved with exponentially decaying noise of a set RT60, docs/benchmarks.md
"Clone checks"): within 0.1 s from 0.4 to 1.0 s, and it reads ~0.3 s on dry speech (speech's own
offsets), so only decay times clearly above that mean a room.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RoomProfile", "convolve", "exponential_room", "reverb_s", "room_profile", "spectrum_db",
           "spectrum_distance_db"]

SAMPLE_RATE = 24000
DECAY_FRAME_S = 0.01
DECAY_WINDOW = 25  # frames: 250 ms, long enough for a 1 s RT60 to fall 15 dB
DECAY_MIN_DB = 8.0  # a stretch is a decay when it falls at least this much
DECAY_START_BELOW_DB = 20.0  # ...and starts within this much of the speech's loud level (95th percentile)
DECAY_SPAN_DB = 50.0  # levels are floored this far under the loud level (digital silence is not -inf)
DECAY_PERCENTILE = 5.0  # the room's free decays: the steepest few
MIN_DECAYS = 10  # fewer decays: no estimate
SPECTRUM_FFT = 1024
ROOM_GAP_S = 0.15  # reverb times this far apart are different rooms (the estimate's own error is ~0.1 s)


def reverb_s(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """The recording's decay time (RT60-style, seconds); NaN with under MIN_DECAYS decays (too
    little speech, or speech that never stops)."""
    x = np.asarray(audio, np.float64)
    n = int(DECAY_FRAME_S * sample_rate)
    frames = x.size // n
    if frames < 2 * DECAY_WINDOW:
        return float("nan")
    level = 10 * np.log10(np.mean(x[:frames * n].reshape(frames, n) ** 2, axis=1) + 1e-20)  # [F] dB
    loud = float(np.percentile(level, 95))
    level = np.maximum(level, loud - DECAY_SPAN_DB)
    runs = np.lib.stride_tricks.sliding_window_view(level, DECAY_WINDOW)  # [F - W + 1, W]
    t = np.arange(DECAY_WINDOW) * DECAY_FRAME_S
    t -= t.mean()
    slope = (runs - runs.mean(axis=1, keepdims=True)) @ t / (t @ t)  # [F - W + 1] dB/s
    decays = (runs[:, 0] >= loud - DECAY_START_BELOW_DB) & (runs[:, 0] - runs[:, -1] >= DECAY_MIN_DB)
    if int(decays.sum()) < MIN_DECAYS:
        return float("nan")
    steepest = float(np.percentile(slope[decays], DECAY_PERCENTILE))
    return float(-60.0 / steepest) if steepest < 0 else float("nan")


def spectrum_db(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """[SPECTRUM_FFT // 2 + 1] long-term spectrum of the louder half of the frames (the speech), in
    dB, smoothed over a third of an octave and set to 0 dB on average over 300-3000 Hz: the colour a
    microphone and a room give a voice (the voice's own colour is in it too)."""
    x = np.asarray(audio, np.float64)
    count = x.size // SPECTRUM_FFT
    if count < 4:
        return np.zeros(SPECTRUM_FFT // 2 + 1)
    frames = x[:count * SPECTRUM_FFT].reshape(count, SPECTRUM_FFT) * np.hanning(SPECTRUM_FFT)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2  # [C, K]
    energy = power.sum(axis=1)
    mean = power[energy >= np.median(energy)].mean(axis=0) + 1e-20  # [K]
    freqs = np.fft.rfftfreq(SPECTRUM_FFT, 1 / sample_rate)
    cum = np.concatenate([[0.0], np.cumsum(mean)])
    lo = np.searchsorted(freqs, freqs / 2 ** (1 / 6), side="left")
    hi = np.maximum(np.searchsorted(freqs, freqs * 2 ** (1 / 6), side="right"), lo + 1)
    smooth = 10 * np.log10((cum[hi] - cum[lo]) / (hi - lo))
    return smooth - smooth[(freqs > 300) & (freqs < 3000)].mean()


@dataclass(frozen=True, slots=True)
class RoomProfile:
    """A recording's room and microphone: its decay time and long-term spectrum."""

    reverb_s: float  # NaN: not measured
    spectrum_db: np.ndarray

    def differs_from(self, other: RoomProfile) -> bool:
        """Do the two sound like different rooms or microphones: decay times more than ROOM_GAP_S
        apart, or spectra more than SPECTRUM_GAP_DB apart (rms over 100 Hz - 8 kHz)?"""
        gap = abs(self.reverb_s - other.reverb_s)
        return bool((np.isfinite(gap) and gap > ROOM_GAP_S) or spectrum_distance_db(self, other) > SPECTRUM_GAP_DB)


SPECTRUM_GAP_DB = 4.0


def spectrum_distance_db(a: RoomProfile, b: RoomProfile, sample_rate: int = SAMPLE_RATE) -> float:
    freqs = np.fft.rfftfreq(SPECTRUM_FFT, 1 / sample_rate)
    band = (freqs > 100) & (freqs < 8000)
    return float(np.sqrt(np.mean((a.spectrum_db[band] - b.spectrum_db[band]) ** 2)))


def room_profile(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> RoomProfile:
    return RoomProfile(reverb_s(audio, sample_rate), spectrum_db(audio, sample_rate))


def exponential_room(rt60_s: float, sample_rate: int = SAMPLE_RATE, seed: int = 7) -> np.ndarray:
    """A known truth for `reverb_s`: an impulse response of a room with decay time `rt60_s`: the
    direct sound, then Gaussian noise decaying by 60 dB in `rt60_s` (Polack's model of a diffuse
    room), unit energy."""
    n = int(1.5 * rt60_s * sample_rate) + 1
    t = np.arange(n) / sample_rate
    h = np.random.default_rng(seed).standard_normal(n) * np.exp(-6.9078 * t / rt60_s)
    h[0] = 1.0
    return h / np.sqrt(np.sum(h ** 2))


def convolve(audio: np.ndarray, response: np.ndarray) -> np.ndarray:
    """`audio` through the impulse `response`, as long as `audio` (by FFT: a 1 s response over a
    minute of audio is 24,000 x 1.4 M multiply-adds directly)."""
    n = audio.size + response.size - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(response, size), size)[:audio.size]
