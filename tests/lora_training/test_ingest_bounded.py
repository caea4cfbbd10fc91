"""Decoding is bounded (issue 19): every container is read block by block, so a long file never
sits in memory whole, and every decode stops at its cap in audio seconds, from the header when the
header declares the length and the moment the decoded audio passes the cap when it does not (a
streamed webm/mkv declares none). Memory is measured with tracemalloc (numpy's buffers are traced)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import soxr

from lora_training.errors import AudioTooLong
from lora_training.ingest import BLOCK_FRAMES, declared_duration_s, ingest, inspect, max_audio_s
from lora_training.segment import active_frames, regions_of, speech_regions
from lora_training.settings import DataParams
from tests.fixtures.hostile import silent_stream

SMALL = DataParams(min_speech_s=5.0, max_speech_s=20.0)  # cap: max_audio_s = 30 s
RATE = 48_000
FILE_S = 180.0  # three minutes: 35 MB as float32 at 48 kHz, far more than any bound below
MB = 1 << 20


def tone(seconds: float, rate: int = RATE) -> np.ndarray:
    """A speech-like burst pattern: 1 s of a 200 Hz vowel, 0.5 s of pause, over and over. [n] float32."""
    t = np.arange(int(seconds * rate)) / rate
    on = (t % 1.5) < 1.0
    return (0.25 * np.sin(2 * np.pi * 200 * t) * on).astype(np.float32)


def write(path: Path, x: np.ndarray, rate: int = RATE) -> Path:
    kind = path.suffix
    if kind == ".m4a":
        with av.open(str(path), "w") as out:
            stream = out.add_stream("aac", rate=rate, layout="mono")
            for at in range(0, x.size, rate * 10):  # ten seconds per frame
                frame = av.AudioFrame.from_ndarray(x[None, at:at + rate * 10], format="fltp", layout="mono")
                frame.sample_rate, frame.pts = rate, at
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
    else:
        formats = {".wav": ("WAV", "PCM_16"), ".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "VORBIS"),
                   ".mp3": ("MP3", "MPEG_LAYER_III")}
        fmt, subtype = formats[kind]
        with sf.SoundFile(str(path), "w", rate, 1, subtype, format=fmt) as f:
            for at in range(0, x.size, rate):  # a second at a time (libvorbis crashes on one long write)
                f.write(x[at:at + rate])
    return path


def streamed_silence(path: Path, seconds: float, *, codec: str = "aac") -> Path:
    """`seconds` of silence in a streamed mkv/webm: no duration anywhere in the file."""
    return silent_stream(path, seconds, container="webm" if codec == "libopus" else "matroska", codec=codec,
                         seekable=False)


def traced(call):
    """(result or raised error, peak bytes traced while `call` ran)."""
    tracemalloc.start()
    try:
        try:
            outcome = call()
        except AudioTooLong as err:
            outcome = err
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


FORMATS = [".wav", ".flac", ".ogg", ".mp3", ".m4a"]


@pytest.fixture(scope="module")
def long_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("long")
    x = tone(FILE_S)
    return {kind: write(folder / f"long{kind}", x) for kind in FORMATS}


@pytest.mark.parametrize("kind", FORMATS)
def test_a_long_file_is_inspected_one_block_at_a_time(long_files, kind):
    """Three minutes at 48 kHz: the whole-file decode held the samples, their float64 mono and the
    resampled copy (over 100 MB); the checks now hold a block and the 10 ms levels."""
    path = long_files[kind]
    seen, peak = traced(lambda: inspect(path, DataParams()))
    assert abs(seen.duration_s - FILE_S) < 0.2 and seen.source_rate == RATE and seen.channels == 1
    regions = regions_of(active_frames(seen.levels), seen.samples, DataParams())
    assert 90 < sum(end - start for start, end in regions) / 24_000 < 150  # two thirds of it is the vowel
    assert peak < 8 * MB, f"{peak / MB:.1f} MB traced"


@pytest.mark.parametrize("kind", FORMATS)
def test_a_file_declaring_more_than_the_cap_is_refused_before_a_block_is_decoded(long_files, kind):
    path = long_files[kind]
    assert declared_duration_s(path) == pytest.approx(FILE_S, abs=0.5)
    blocks = []
    for read in (ingest, inspect):
        err, peak = traced(lambda: read(path, SMALL, check=lambda: blocks.append(1)))
        assert isinstance(err, AudioTooLong) and err.code == "audio_too_long"
        assert err.message.startswith(f"long{kind}: declares 3 minutes of audio; a voice may use at most 30 s of")
        assert blocks == [] and peak < 1 * MB


@pytest.mark.parametrize(("codec", "hours"), [("aac", 1), ("libopus", 1)])
def test_a_stream_that_declares_no_length_stops_at_the_cap(tmp_path, codec, hours):
    """A streamed mkv/webm of hours declares no duration: decoding runs to the cap and stops there,
    holding (inspect) a block and the levels, (ingest) the 24 kHz audio up to the cap."""
    path = streamed_silence(tmp_path / "hours.mkv", hours * 3600, codec=codec)
    assert path.stat().st_size < 8 * MB and declared_duration_s(path) is None
    cap = max_audio_s(SMALL)
    for read, bound in ((inspect, 4 * MB), (ingest, cap * 24_000 * 4 * 2 + 4 * MB)):
        err, peak = traced(lambda: read(path, SMALL))
        assert isinstance(err, AudioTooLong), err
        assert cap < err.audio_s <= cap + 2 * BLOCK_FRAMES / 24_000
        assert err.message == ("hours.mkv: holds over 30 s of audio (decoding stopped there); a voice may use at "
                               "most 30 s of audio: upload shorter recordings")
        assert peak < bound, f"{read.__name__}: {peak / MB:.1f} MB traced"


def test_the_default_cap_bounds_an_hour_long_stream_to_its_levels(tmp_path):
    """At the default cap (2700 s, 45 minutes of audio) the checks still hold a few MB."""
    path = streamed_silence(tmp_path / "hours.mkv", 3600)
    err, peak = traced(lambda: inspect(path, DataParams()))
    assert isinstance(err, AudioTooLong) and max_audio_s(DataParams()) == 2700.0
    assert 2700.0 < err.audio_s < 2702.0
    assert peak < 16 * MB, f"{peak / MB:.1f} MB traced"


@pytest.mark.parametrize("kind", [".wav", ".flac"])
def test_streamed_decoding_gives_the_samples_of_a_whole_file_decode(tmp_path, kind):
    """Block by block (mono, then a streaming soxr) is the same audio as the whole array at once,
    and the levels `inspect` keeps find the same speech as the audio `ingest` keeps."""
    x = np.stack([tone(20.0, 44_100), 0.5 * tone(20.0, 44_100)], axis=1)  # [n, 2]
    path = tmp_path / f"take{kind}"
    sf.write(str(path), x, 44_100, subtype="PCM_16")
    whole, _ = sf.read(str(path), dtype="float32", always_2d=True)
    expected = soxr.resample(whole.mean(axis=1, dtype=np.float64), 44_100, 24_000, quality="HQ").astype(np.float32)
    recording = ingest(path, DataParams())
    np.testing.assert_array_equal(recording.audio, expected)
    seen = inspect(path, DataParams())
    assert seen.samples == recording.audio.size and recording.channels == seen.channels == 2
    assert regions_of(active_frames(seen.levels), seen.samples, DataParams()) == speech_regions(recording.audio,
                                                                                               DataParams())
