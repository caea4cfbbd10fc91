"""Decoding a creator's uploads into 24 kHz mono float audio, and refusing unusable files.

Any container libsndfile reads (wav, flac, ogg/vorbis, ogg/opus, mp3 with libsndfile >= 1.1)
goes through soundfile; anything else (m4a/aac, webm...) through PyAV (FFmpeg). Channels are
averaged, the rate converted with soxr (HQ). Each file is checked on its own: decodable, sample
rate at least `min_sample_rate`, not clipping-heavy, not near-silent. Totals are checked after
segmentation (`check_speech_total`), on the speech actually found.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.errors import AudioError, SpeechAmountError
from lora_training.settings import DataParams

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".webm")
FULL_SCALE = 0.999


@dataclass(frozen=True)
class Decoded:
    """A file as decoded: float32 samples [n, channels] at the file's own rate."""

    samples: np.ndarray
    sample_rate: int


@dataclass(frozen=True)
class Recording:
    """One uploaded file, as 24 kHz mono float32, with what was learnt reading it."""

    name: str  # file name, the key transcripts are matched on
    audio: np.ndarray  # [n] float32 at 24 kHz
    source_rate: int
    channels: int
    clipped_fraction: float
    peak_dbfs: float

    @property
    def duration_s(self) -> float:
        return self.audio.size / SAMPLE_RATE


def decode(path: Path) -> Decoded:
    """Decode a whole file; AudioError saying what to do when neither decoder can read it."""
    import soundfile as sf

    try:
        samples, rate = sf.read(str(path), dtype="float32", always_2d=True)  # [n, ch]
        return Decoded(samples, int(rate))
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError) as sf_error:
        first = sf_error
    except OSError as err:
        raise AudioError(f"{path.name}: cannot open the file ({err})") from None
    try:
        return _decode_av(path)
    except AudioError:
        raise
    except Exception as av_error:  # PyAV raises many error types (av.error.*); all mean "not decodable"
        raise AudioError(
            f"{path.name}: not a readable audio file ({first}; {type(av_error).__name__}: {av_error}). "
            f"Upload wav, flac, mp3, ogg/opus or m4a."
        ) from None


def _decode_av(path: Path) -> Decoded:
    import av

    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise AudioError(f"{path.name}: the file has no audio stream")
        stream = container.streams.audio[0]
        planar = av.AudioResampler(format="fltp")  # float planar, same layout and rate
        blocks: list[np.ndarray] = []
        rate = stream.codec_context.sample_rate
        for frame in container.decode(stream):
            for converted in planar.resample(frame):
                blocks.append(converted.to_ndarray())  # [ch, n]
                rate = converted.sample_rate
        for converted in planar.resample(None):
            blocks.append(converted.to_ndarray())
    if not blocks:
        raise AudioError(f"{path.name}: the audio stream holds no samples")
    return Decoded(np.concatenate(blocks, axis=1).T.astype(np.float32), int(rate))  # [n, ch]


def to_24k_mono(decoded: Decoded) -> np.ndarray:
    """Average the channels, resample to 24 kHz (soxr HQ): [n, ch] -> [m] float32."""
    import soxr

    mono = decoded.samples.mean(axis=1, dtype=np.float64)  # [n]
    if decoded.sample_rate != SAMPLE_RATE:
        mono = soxr.resample(mono, decoded.sample_rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def ingest(path: Path, data: DataParams) -> Recording:
    """Decode, check and convert one upload."""
    decoded = decode(path)
    samples = decoded.samples
    if samples.size == 0:
        raise AudioError(f"{path.name}: the file holds no audio samples")
    if not np.isfinite(samples).all():
        raise AudioError(f"{path.name}: the audio holds NaN or infinite samples; export it again")
    if decoded.sample_rate < data.min_sample_rate:
        raise AudioError(
            f"{path.name}: sample rate {decoded.sample_rate} Hz is below {data.min_sample_rate} Hz; "
            "record or export at 24 kHz or more (telephone-quality audio makes a muffled voice)"
        )
    clipped = float(np.mean(np.abs(samples) >= FULL_SCALE))
    if clipped > data.max_clipped_fraction:
        raise AudioError(
            f"{path.name}: {clipped:.1%} of the samples are at full scale (clipping); "
            "record again with lower input gain"
        )
    peak = float(np.max(np.abs(samples)))
    peak_dbfs = 20.0 * np.log10(peak) if peak > 0 else -np.inf
    if peak_dbfs < data.min_peak_dbfs:
        raise AudioError(
            f"{path.name}: the audio is near-silent (peak {peak_dbfs:.0f} dBFS); check the microphone and upload again"
        )
    return Recording(path.name, to_24k_mono(decoded), decoded.sample_rate, samples.shape[1], clipped, peak_dbfs)


def check_speech_total(speech_s: float, data: DataParams) -> None:
    """The speech found across all files must be within [min_speech_s, max_speech_s]."""
    if speech_s < data.min_speech_s:
        raise SpeechAmountError(
            f"only {speech_s:.0f} s of usable speech found; at least {data.min_speech_s:.0f} s is needed "
            f"and about {data.recommended_speech_s / 60:.0f} minutes is recommended"
        )
    if speech_s > data.max_speech_s:
        raise SpeechAmountError(
            f"{speech_s / 60:.1f} minutes of speech found; the limit is {data.max_speech_s / 60:.0f} minutes: "
            "upload fewer files"
        )


def file_digest(path: Path) -> str:
    """Content hash of an upload (cache keys: a changed file never reuses stale clips)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
