"""Reading and writing audio files (wav, flac and whatever libsndfile reads) through soundfile.

Samples are read in a dtype that keeps the file's precision (PCM_16 as int16, PCM_24/32 as
int32, float as float), so a trimmed file keeps its kept samples bit for bit. soundfile's errors
become AudioFileError here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from silence_trim.errors import AudioFileError

_DTYPE_OF_SUBTYPE = {
    "PCM_S8": "int16", "PCM_U8": "int16", "PCM_16": "int16",
    "PCM_24": "int32", "PCM_32": "int32",
    "FLOAT": "float32", "DOUBLE": "float64",
}


@dataclass(frozen=True)
class AudioFile:
    """A decoded file: samples shaped (n,) or (n, channels), and how the file stored them."""

    samples: np.ndarray
    sample_rate: int
    format: str  # soundfile major format, e.g. "WAV", "FLAC"
    subtype: str  # e.g. "PCM_16", "FLOAT"


def read_audio(path: str | Path) -> AudioFile:
    """Decode a whole file; AudioFileError when it is missing, corrupt or not audio."""
    path = Path(path)
    try:
        info = sf.info(str(path))
        dtype = _DTYPE_OF_SUBTYPE.get(info.subtype, "float32")
        samples, rate = sf.read(str(path), dtype=dtype, always_2d=False)
    except (sf.SoundFileError, RuntimeError, OSError, ValueError) as err:
        raise AudioFileError(f"cannot read {path}: {err}") from err
    return AudioFile(samples=samples, sample_rate=int(rate), format=info.format, subtype=info.subtype)


def write_audio(path: str | Path, samples: np.ndarray, sample_rate: int, *, subtype: str | None = None) -> None:
    """Write samples; the format follows the file suffix, `subtype` is kept when that format allows it."""
    path = Path(path)
    try:
        major = path.suffix.lstrip(".").upper()
        if subtype is not None and (major not in sf.available_formats() or not sf.check_format(major, subtype)):
            subtype = None
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(path), samples, sample_rate, subtype=subtype)
    except (sf.SoundFileError, RuntimeError, OSError, TypeError, ValueError) as err:
        raise AudioFileError(f"cannot write {path}: {err}") from err
