"""Decoding a creator's uploads into 24 kHz mono float audio, block by block, and refusing unusable files.

Any container libsndfile reads (wav, flac, ogg/vorbis, ogg/opus, mp3 with libsndfile >= 1.1)
goes through soundfile (`SoundFile.blocks`); anything else (m4a/aac, webm...) through PyAV
(FFmpeg), frame by frame, gathered into blocks of `BLOCK_FRAMES`. Each block is checked as it comes
(finite samples, sample rate at least `min_sample_rate`), counted into running statistics
(clipped samples, peak), averaged to mono and resampled to 24 kHz by a streaming soxr (HQ; the
same samples as one whole-array call). What is kept of the 24 kHz stream is the caller's choice:
`ingest` keeps it all (the trainer cuts clips from it), `inspect` only its 10 ms frame levels (the
gateway's quick checks). So no decode ever holds more than one block of source audio.

Every decode has a cap in audio seconds (`max_s`, by default `max_audio_s(data)`, 2700 s per file
with the default 30 minutes of speech): a file whose header declares more is refused before a
sample is decoded, and one that declares nothing (streamed webm/mkv) or less than it holds is
refused the moment its decoded audio passes the cap (`AudioTooLong`). Per file, the other checks:
not clipping-heavy, not near-silent. Totals are checked after segmentation (`check_speech_total`),
on the speech actually found.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.errors import AudioError, AudioTooLong, SpeechAmountError
from lora_training.settings import DataParams

__all__ = ["AUDIO_PER_SPEECH", "AUDIO_SUFFIXES", "BLOCK_FRAMES", "Check", "ClipStats", "Inspection", "Recording",
           "check_speech_total", "declared_duration_s", "file_digest", "ingest", "inspect", "max_audio_s"]

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".webm")
FULL_SCALE = 0.999
AUDIO_PER_SPEECH: Final = 1.5  # audio an upload may hold per second of max_speech_s (pauses, retakes)
BLOCK_FRAMES: Final = 1 << 16  # source frames decoded, checked and converted at a time (~1.4 s at 48 kHz)
LEVEL_FRAME: Final = SAMPLE_RATE // 100  # 10 ms at 24 kHz: the frames lora_training.segment reads speech from

Check = Callable[[], None]  # called between blocks; what it raises ends the decode there


def max_audio_s(data: DataParams) -> float:
    """The most audio, in seconds, one upload (and so one file) may hold: more is refused unread."""
    return data.max_speech_s * AUDIO_PER_SPEECH


@dataclass(frozen=True)
class Recording:
    """One uploaded file, as 24 kHz mono float32, with what was learnt reading it."""

    name: str  # file name, the key transcripts are matched on
    audio: np.ndarray  # [n] float32 at 24 kHz
    source_rate: int
    channels: int
    clipped_fraction: float
    peak_dbfs: float
    clip: ClipStats | None = None  # where the clipping is (lora_training.quality.checks)

    @property
    def duration_s(self) -> float:
        return self.audio.size / SAMPLE_RATE


@dataclass(frozen=True)
class Inspection:
    """One uploaded file as the quick checks need it: what `ingest` learns, and instead of the audio
    its 10 ms frame levels (a few MB for the longest file allowed)."""

    name: str
    samples: int  # at 24 kHz
    levels: np.ndarray  # [ceil(samples / LEVEL_FRAME)] float64, dBFS of each 10 ms frame
    source_rate: int
    channels: int
    clipped_fraction: float
    peak_dbfs: float
    clip: ClipStats | None = None  # where the clipping is (lora_training.quality.checks)

    @property
    def duration_s(self) -> float:
        return self.samples / SAMPLE_RATE


@dataclass(frozen=True)
class ClipStats:
    """Where a file's source samples sit at full scale: the longest run (frames) and its start, the
    first and last clipped frame, in seconds of the file (-1: none); `samples` counts every channel."""

    samples: int = 0
    longest: int = 0
    longest_at_s: float = -1.0
    first_s: float = -1.0
    last_s: float = -1.0


@dataclass
class _Tally:
    """Running statistics of a file's source samples, counted block by block."""

    rate: int = 0
    channels: int = 0
    frames: int = 0
    clipped: int = 0
    peak: float = 0.0
    run_open: int = 0  # clipped frames at the end of the last block (a run that may go on)
    longest: int = 0
    longest_at: int = -1  # frame indices in the file
    first_clip: int = -1
    last_clip: int = -1

    def count_runs(self, at_full_scale: np.ndarray) -> None:
        """Fold one block's clipped frames ([n] bool, starting at frame `frames - n`) into the runs."""
        from lora_training.quality.signal import clip_runs

        runs = clip_runs(at_full_scale, self.run_open)
        offset = self.frames - at_full_scale.size
        if runs.count:
            if runs.longest > self.longest:
                self.longest, self.longest_at = runs.longest, offset + runs.longest_at
            self.first_clip = offset + runs.first_at if self.first_clip < 0 else self.first_clip
            self.last_clip = offset + runs.last_at
        self.run_open = runs.open_run  # includes the carried run when the whole block is clipped

    def clip_stats(self) -> ClipStats:
        s = 1.0 / self.rate if self.rate else 0.0
        return ClipStats(self.clipped, self.longest, self.longest_at * s if self.longest_at >= 0 else -1.0,
                         self.first_clip * s if self.first_clip >= 0 else -1.0,
                         self.last_clip * s if self.last_clip >= 0 else -1.0)


def ingest(path: Path, data: DataParams, *, max_s: float | None = None, check: Check | None = None) -> Recording:
    """Decode, check and convert one upload, refusing it past `max_s` seconds of audio (default
    `max_audio_s(data)`) without decoding further."""
    tally = _Tally()
    chunks = list(_decode_24k(path, data, tally, max_s, check))
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)  # [n] float32
    clipped, peak_dbfs = _check_tally(path, tally, data)
    return Recording(path.name, audio, tally.rate, tally.channels, clipped, peak_dbfs, tally.clip_stats())


def inspect(path: Path, data: DataParams, *, max_s: float | None = None, check: Check | None = None) -> Inspection:
    """`ingest`'s checks on one upload, keeping only the 10 ms frame levels of its 24 kHz audio
    (`lora_training.segment.active_frames` and `regions_of` find its speech in them)."""
    from silence_trim.levels import LevelMeter

    tally = _Tally()
    meter = LevelMeter(LEVEL_FRAME)
    levels: list[np.ndarray] = []
    samples = 0
    for chunk in _decode_24k(path, data, tally, max_s, check):
        levels.append(meter.push(chunk.astype(np.float64)))
        samples += chunk.size
    levels.append(meter.finish())
    clipped, peak_dbfs = _check_tally(path, tally, data)
    return Inspection(path.name, samples, np.concatenate(levels), tally.rate, tally.channels, clipped, peak_dbfs,
                      tally.clip_stats())


def declared_duration_s(path: Path) -> float | None:
    """The seconds of audio a file's header declares, or None when it declares none (or neither
    decoder reads it): a bound to refuse on before decoding, never a promise."""
    try:
        with _open(path) as source:
            return source.declared_s
    except AudioError:
        return None


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


# -- the streamed decode ----------------------------------------------------------------------------


def _decode_24k(path: Path, data: DataParams, tally: _Tally, max_s: float | None,
                check: Check | None) -> Iterator[np.ndarray]:
    """The file as 24 kHz mono float32 chunks, one per decoded block, each block checked and counted
    into `tally`; AudioTooLong from the header, or as soon as the decoded audio passes `max_s`."""
    cap_s = max_audio_s(data) if max_s is None else max_s
    with _open(path) as source:
        if source.declared_s is not None and source.declared_s > cap_s:
            raise _too_long(path, source.declared_s, cap_s, declared=True)
        resampler = None
        for block, rate in source.blocks:  # block: [n, ch] float32
            if check is not None:
                check()
            if resampler is None:
                if rate < data.min_sample_rate:
                    raise AudioError(
                        f"{path.name}: sample rate {rate} Hz is below {data.min_sample_rate} Hz; "
                        "record or export at 24 kHz or more (telephone-quality audio makes a muffled voice)")
                tally.rate, tally.channels = rate, block.shape[1]
                resampler = _Resampler(rate)
            elif rate != tally.rate or block.shape[1] != tally.channels:
                raise AudioError(f"{path.name}: the audio changes sample rate or channels midway; export it "
                                 "again as one stream")
            tally.frames += block.shape[0]
            if tally.frames > cap_s * rate:
                raise _too_long(path, tally.frames / rate, cap_s, declared=False)
            if not np.isfinite(block).all():
                raise AudioError(f"{path.name}: the audio holds NaN or infinite samples; export it again")
            magnitude = np.abs(block)  # [n, ch]
            tally.clipped += int(np.count_nonzero(magnitude >= FULL_SCALE))
            tally.count_runs((magnitude >= FULL_SCALE).any(axis=1))
            tally.peak = max(tally.peak, float(magnitude.max(initial=0.0)))
            yield resampler.push(block.mean(axis=1, dtype=np.float64))
        if resampler is not None:
            yield resampler.finish()


def _check_tally(path: Path, tally: _Tally, data: DataParams) -> tuple[float, float]:
    """The whole-file checks on the running statistics: (clipped fraction, peak dBFS)."""
    if tally.frames == 0:
        raise AudioError(f"{path.name}: the file holds no audio samples")
    clipped = tally.clipped / (tally.frames * tally.channels)
    if clipped > data.max_clipped_fraction:
        raise AudioError(f"{path.name}: {clipped:.1%} of the samples are at full scale (clipping); "
                         "record again with lower input gain")
    peak_dbfs = 20.0 * np.log10(tally.peak) if tally.peak > 0 else -np.inf
    if peak_dbfs < data.min_peak_dbfs:
        raise AudioError(f"{path.name}: the audio is near-silent (peak {peak_dbfs:.0f} dBFS); check the microphone "
                         "and upload again")
    return clipped, float(peak_dbfs)


def _too_long(path: Path, audio_s: float, cap_s: float, *, declared: bool) -> AudioTooLong:
    seen = (f"declares {_span(audio_s)} of audio" if declared
            else f"holds over {_span(audio_s)} of audio (decoding stopped there)")
    most = f"{cap_s:.0f} s" + (f" ({cap_s / 60:.0f} minutes)" if cap_s >= 120 else "")
    return AudioTooLong(f"{path.name}: {seen}; a voice may use at most {most} of audio: upload shorter recordings",
                        audio_s)


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} s"


class _Resampler:
    """Mono float64 at the source rate -> 24 kHz float32, streamed (soxr HQ; identical to one call)."""

    def __init__(self, rate: int) -> None:
        import soxr

        self._stream = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float64",
                                                                             quality="HQ")

    def push(self, mono: np.ndarray) -> np.ndarray:
        out = mono if self._stream is None else self._stream.resample_chunk(mono)
        return np.ascontiguousarray(out, dtype=np.float32)

    def finish(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.float32)
        return np.ascontiguousarray(self._stream.resample_chunk(np.zeros(0), last=True), dtype=np.float32)


# -- the two decoders -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    declared_s: float | None  # what the header says, if anything
    blocks: Iterator[tuple[np.ndarray, int]]  # ([n, ch] float32, sample rate), n <= BLOCK_FRAMES + one frame


@contextmanager
def _open(path: Path) -> Iterator[_Source]:
    """The file opened by soundfile, else by PyAV; AudioError saying what to do when neither reads it.
    Decode errors midway are AudioErrors too."""
    import soundfile as sf

    try:
        handle = sf.SoundFile(str(path))
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError) as sf_error:
        first = sf_error
    except OSError as err:
        raise AudioError(f"{path.name}: the file could not be opened; upload it again", detail=str(err)) from None
    else:
        with handle:
            declared = handle.frames / handle.samplerate if handle.samplerate > 0 and handle.frames > 0 else None
            try:
                yield _Source(declared, _sf_blocks(handle))
            except (sf.SoundFileError, RuntimeError) as err:
                raise _damaged(path, err) from None
        return
    import av

    try:
        container = av.open(str(path))
    except Exception as av_error:  # PyAV raises many error types (av.error.*); all mean "not decodable"
        raise AudioError(f"{path.name}: not a readable audio file (another kind of file with an audio name, or a "
                         "damaged one); export the recording as wav, flac, mp3, ogg/opus or m4a and upload that",
                         detail=f"soundfile: {first}; PyAV: {type(av_error).__name__}: {av_error}") from None
    with container:
        if not container.streams.audio:
            raise AudioError(f"{path.name}: the file has no audio stream")
        stream = container.streams.audio[0]
        declared = None
        if container.duration is not None and container.duration > 0:
            declared = container.duration / av.time_base
        elif stream.duration is not None and stream.time_base is not None and stream.duration > 0:
            declared = float(stream.duration * stream.time_base)
        try:
            yield _Source(declared, _av_blocks(container, stream))
        except (av.error.FFmpegError, ValueError) as err:  # a damaged packet, a stream that changes format
            raise _damaged(path, err) from None


def _damaged(path: Path, err: Exception) -> AudioError:
    return AudioError(f"{path.name}: the audio is damaged partway through; export the recording again and upload it",
                      detail=f"{type(err).__name__}: {err}")


def _sf_blocks(handle) -> Iterator[tuple[np.ndarray, int]]:
    rate = int(handle.samplerate)
    for block in handle.blocks(blocksize=BLOCK_FRAMES, dtype="float32", always_2d=True):  # [n, ch]
        yield block, rate


def _av_blocks(container, stream) -> Iterator[tuple[np.ndarray, int]]:
    """Decoded frames, float planar at the first frame's rate and layout, gathered into blocks."""
    import av

    resampler = None
    pending: list[np.ndarray] = []  # [ch, n] float32 each
    held = 0
    rate = 0
    for frame in container.decode(stream):
        if resampler is None:
            rate = int(frame.sample_rate)
            resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=rate)
        for converted in resampler.resample(frame):
            pending.append(converted.to_ndarray())
            held += converted.samples
        if held >= BLOCK_FRAMES:
            yield np.concatenate(pending, axis=1).T, rate  # [n, ch]
            pending, held = [], 0
    if resampler is not None:
        for converted in resampler.resample(None):
            pending.append(converted.to_ndarray())
    if pending:
        yield np.concatenate(pending, axis=1).T, rate
