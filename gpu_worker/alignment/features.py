"""Frames of spectral shape for aligning speech to speech: 13 mel cepstra every 10 ms.

Cepstra (without c0, the loudness) compare what is said more than who says it or how loud, which
is what an alignment of a generated voice against a synthetic reference needs; each frame's level
(dB) comes beside them, to tell speech from pauses. Each frame is
computed from its own 25 ms window only, so audio can be featurized piece by piece as it streams
(`FeatureStream`) and give the same frames as the whole at once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CEPSTRA", "HOP_S", "FeatureStream", "features"]

HOP_S = 0.010
WINDOW_S = 0.025
MELS = 40
CEPSTRA = 13
TOP_HZ = 7600.0


def _mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _dct(rows: int, cols: int) -> np.ndarray:
    """The orthonormal DCT-II basis: (cols, rows) so that logmel @ basis gives cepstra 0..rows-1."""
    n = np.arange(cols)
    basis = np.cos(np.pi / cols * (n[:, None] + 0.5) * np.arange(rows)[None, :]) * np.sqrt(2.0 / cols)
    basis[:, 0] /= np.sqrt(2.0)
    return basis.astype(np.float32)


def _filterbank(sample_rate: int, n_fft: int) -> np.ndarray:
    """MELS triangular filters over the rfft bins, 60 Hz .. TOP_HZ."""
    edges_mel = np.linspace(_mel(np.array(60.0)), _mel(np.array(min(TOP_HZ, sample_rate / 2))), MELS + 2)
    edges_hz = 700.0 * (10 ** (edges_mel / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    bank = np.zeros((MELS, len(bins)), np.float32)
    for m in range(MELS):
        lo, mid, hi = edges_hz[m], edges_hz[m + 1], edges_hz[m + 2]
        rise = (bins - lo) / (mid - lo)
        fall = (hi - bins) / (hi - mid)
        bank[m] = np.clip(np.minimum(rise, fall), 0.0, None)
    return bank


class FeatureStream:
    """Feed PCM in pieces of any size; `push` returns the frames those samples completed."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.hop = int(round(HOP_S * sample_rate))
        self.window = int(round(WINDOW_S * sample_rate))
        self.n_fft = 1 << (self.window - 1).bit_length()
        self._taper = np.hamming(self.window).astype(np.float32)
        self._bank = _filterbank(sample_rate, self.n_fft)
        self._dct = _dct(CEPSTRA + 1, MELS)[:, 1:]  # c0 (loudness) left out: `levels` has it
        self._pending = np.zeros(0, np.float32)  # samples not yet consumed by a whole hop

    def push(self, pcm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For every window that `pcm` completed: its cepstra (frames, CEPSTRA) and its level (dB)."""
        buf = np.concatenate([self._pending, np.asarray(pcm, np.float32)])
        count = 0 if len(buf) < self.window else 1 + (len(buf) - self.window) // self.hop
        if count == 0:
            self._pending = buf
            return np.zeros((0, CEPSTRA), np.float32), np.zeros(0, np.float32)
        starts = np.arange(count) * self.hop
        windows = buf[starts[:, None] + np.arange(self.window)[None, :]] * self._taper
        self._pending = buf[count * self.hop:]
        power = np.abs(np.fft.rfft(windows, n=self.n_fft, axis=1)) ** 2
        logmel = np.log(power @ self._bank.T + 1e-8)
        levels = 10 * np.log10((windows ** 2).mean(axis=1) + 1e-12)
        return (logmel @ self._dct).astype(np.float32), levels.astype(np.float32)


def features(pcm: np.ndarray, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """The frames of a whole piece of audio and their levels (as one `FeatureStream` fed it in pieces)."""
    return FeatureStream(sample_rate).push(pcm)
