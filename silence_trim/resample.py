"""Streaming resampling to the VAD's 16 kHz, with soxr (high quality), in fixed blocks.

Input is handed to soxr in blocks of a fixed size whatever the caller's chunking, so the
resampled stream, and every decision made on it, is the same for any chunking of the input.
"""

from __future__ import annotations

import numpy as np

BLOCK_MS = 32.0


class BlockResampler:
    """Mono float stream at `in_rate` -> float32 stream at `out_rate`."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._block = max(1, round(in_rate * BLOCK_MS / 1000.0))
        self._pending = np.zeros(0, dtype=np.float32)
        self._stream = None
        if in_rate != out_rate:
            import soxr

            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def push(self, x: np.ndarray) -> np.ndarray:
        """Resampled output that the input so far allows (float32)."""
        x = np.concatenate([self._pending, x.astype(np.float32)])
        whole = x.size // self._block * self._block
        self._pending = x[whole:]
        if self._stream is None:
            return x[:whole]
        out = [self._stream.resample_chunk(block) for block in x[:whole].reshape(-1, self._block)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def finish(self) -> np.ndarray:
        """The rest of the output, once the input has ended."""
        rest, self._pending = self._pending, np.zeros(0, dtype=np.float32)
        if self._stream is None:
            return rest
        return self._stream.resample_chunk(rest, last=True)
