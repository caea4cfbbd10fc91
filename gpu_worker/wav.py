"""WAV files for PCM16 24 kHz mono (the worker's wire format), stdlib only."""

from __future__ import annotations

import wave
from pathlib import Path

from gpu_worker.orpheus import SAMPLE_RATE


def write_wav(path: Path, pcm16: bytes, sample_rate: int = SAMPLE_RATE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm16)
