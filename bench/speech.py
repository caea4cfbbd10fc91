"""Speech ground truth for tests and benchmarks: silence padding, speech onset, exact cuts.

The espeak-ng + sox synthesis itself lives in `lora_training.espeak` (the demo's creator audio is
made there too) and is re-exported here, so tests/fixtures/speech.py, bench/silence.py and
bench/train.py measure on data made the same way.
"""

from __future__ import annotations

import numpy as np

from lora_training.espeak import SAMPLE_RATE, VOICES, MissingTool, require, synthesize

__all__ = ["SAMPLE_RATE", "VOICES", "MissingTool", "require", "synthesize", "pad_silence", "first_loud_sample", "locate"]


def pad_silence(audio: np.ndarray, sample_rate: int, head_ms: float, tail_ms: float = 0.0) -> np.ndarray:
    """`audio` with `head_ms` of digital silence before it and `tail_ms` after (same dtype)."""
    head = np.zeros(round(head_ms * sample_rate / 1000), dtype=audio.dtype)
    tail = np.zeros(round(tail_ms * sample_rate / 1000), dtype=audio.dtype)
    return np.concatenate([head, audio, tail])


def first_loud_sample(audio: np.ndarray, threshold_dbfs: float = -60.0) -> int | None:
    """Index of the first sample at or above `threshold_dbfs` (float in [-1, 1] or int16), or None.

    The ground truth for speech onset in this module's clean audio: espeak-ng + sox -D leave digital
    silence around speech, so nothing before this sample is sound."""
    scale = 32768.0 if audio.dtype == np.int16 else 1.0
    loud = np.flatnonzero(np.abs(audio.astype(np.float64) / scale) >= 10 ** (threshold_dbfs / 20))
    return int(loud[0]) if loud.size else None


def locate(part: np.ndarray, whole: np.ndarray, probe: int = 64) -> int | None:
    """Where `part` (a cut of `whole`, possibly faded at its ends) starts in `whole`, by exact match
    of `probe` samples around its loudest one; None if it is not an exact cut."""
    at = min(int(np.argmax(np.abs(part))), max(part.size - probe, 0))
    chunk = part[at:at + probe]
    for candidate in np.flatnonzero(whole == chunk[0]):
        if np.array_equal(whole[candidate:candidate + chunk.size], chunk):
            return int(candidate) - at
    return None
