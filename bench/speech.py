"""Real speech with known transcripts, for tests and benchmarks: espeak-ng voices resampled by sox.

Needs the Debian packages espeak-ng and sox (`make setup` installs them). sox runs with -D (no
dither), so silence stays digital zero. Shared by tests/fixtures/speech.py, bench/silence.py and
bench/train.py so the data every figure is measured on is made the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

SAMPLE_RATE = 24000
VOICES = ("en-us", "en+f3")  # a US male (F0 ~110 Hz) and a British female variant (F0 ~220 Hz)


class MissingTool(RuntimeError):
    """espeak-ng or sox is not installed."""


def require(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise MissingTool(f"{tool} is not installed: `make setup` installs it (apt-get install espeak-ng sox)")
    return found


def synthesize(text: str, voice: str, path: Path, sample_rate: int = SAMPLE_RATE) -> Path:
    """Speak `text` with espeak-ng `voice` into `path`: mono PCM16 at `sample_rate`."""
    raw = path.with_suffix(".espeak.wav")
    subprocess.run([require("espeak-ng"), "-v", voice, "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(
        [require("sox"), "-D", str(raw), "-r", str(sample_rate), "-c", "1", "-b", "16", str(path), "rate", "-v"],
        check=True, capture_output=True,
    )
    raw.unlink()
    return path


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
