"""gateway.api.encode: every response format decodes back to the audio fed, and bytes leave as
early as the module docstring says (no whole-file buffering)."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from gateway.api import encode
from gateway.api.encode import MEDIA_TYPES, RESPONSE_FORMATS, open_encoder, wav_header

SR = 24000
CHUNK = 2048  # samples: one worker frame, 85 ms
SECONDS = 5.0
CODED = ("mp3", "opus", "aac", "flac", "wav")
LOSSY = ("mp3", "opus", "aac")
DEMUXER = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}
# Decoded length minus input length may exceed 0 by the encoder's priming and last-frame padding.
DURATION_SLACK_S = {"mp3": 0.08, "opus": 0.005, "aac": 0.09, "flac": 0.0, "wav": 0.0}
# The module docstring's table: samples fed before the first audio bytes come back.
FIRST_AUDIO_AFTER = {"pcm": 1, "wav": 1, "mp3": 1728, "opus": 960, "aac": 2048, "flac": 1152}
HEADER_MAGIC = {"pcm": b"", "wav": b"RIFF", "mp3": b"", "opus": b"OggS", "aac": b"", "flac": b"fLaC"}
REPO = Path(__file__).resolve().parents[2]


def sine_pcm(seconds: float = SECONDS, hz: float = 440.0) -> bytes:
    """A 440 Hz sine at -10 dBFS with a little white noise, as 24 kHz s16le."""
    t = np.arange(int(seconds * SR)) / SR
    noise = np.random.default_rng(0).normal(0.0, 0.003, t.size)
    return (np.clip(0.3 * np.sin(2 * np.pi * hz * t) + noise, -1, 1) * 32767).astype("<i2").tobytes()


def pieces(pcm: bytes, samples: int = CHUNK) -> list[bytes]:
    return [pcm[i:i + 2 * samples] for i in range(0, len(pcm), 2 * samples)]


def encode_stream(fmt: str, chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    """What each feed returned, and what close returned."""
    encoder = open_encoder(fmt)
    parts = [encoder.feed(chunk) for chunk in chunks]
    return parts, encoder.close()


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int, int]:
    """PyAV decode of a whole response: (mono float samples, rate, channels)."""
    with av.open(io.BytesIO(data), format=DEMUXER[fmt]) as container:
        frames = list(container.decode(audio=0))
    arrays = [frame.to_ndarray().reshape(len(frame.layout.channels), -1) for frame in frames]
    samples = np.concatenate(arrays, axis=1)  # [channels, n]
    return samples[0].astype(np.float64), frames[0].sample_rate, samples.shape[0]


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.argmax(spectrum)) * rate / samples.size


@pytest.fixture(scope="module")
def pcm() -> bytes:
    return sine_pcm()


@pytest.fixture(scope="module")
def streams(pcm) -> dict[str, tuple[list[bytes], bytes]]:
    return {fmt: encode_stream(fmt, pieces(pcm)) for fmt in RESPONSE_FORMATS}


def body(streams, fmt: str) -> bytes:
    parts, tail = streams[fmt]
    return b"".join(parts) + tail


def test_public_names_and_media_types():
    for name in encode.__all__:
        assert hasattr(encode, name), name
    assert RESPONSE_FORMATS == ("mp3", "opus", "aac", "flac", "wav", "pcm")
    assert dict(MEDIA_TYPES) == {
        "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
        "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm",
    }


@pytest.mark.parametrize("fmt", CODED)
def test_decodes_to_the_same_duration_mono(streams, fmt):
    samples, rate, channels = decode(body(streams, fmt), fmt)
    assert channels == 1
    assert rate == (48000 if fmt == "opus" else SR)
    extra = samples.size / rate - SECONDS
    assert 0.0 <= extra <= DURATION_SLACK_S[fmt] + 1e-9, f"{fmt}: {extra * 1000:.1f} ms longer"


@pytest.mark.parametrize("fmt", LOSSY)
def test_lossy_codecs_keep_the_pitch(streams, fmt):
    samples, rate, _ = decode(body(streams, fmt), fmt)
    assert peak_hz(samples, rate) == pytest.approx(440.0, abs=2.0)


def test_pcm_is_the_input_byte_for_byte(streams, pcm):
    parts, tail = streams["pcm"]
    assert parts == pieces(pcm) and tail == b""


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_formats_decode_to_the_exact_samples(streams, pcm, fmt):
    with av.open(io.BytesIO(body(streams, fmt)), format=DEMUXER[fmt]) as container:
        samples = np.concatenate([frame.to_ndarray()[0] for frame in container.decode(audio=0)])
    assert np.array_equal(samples, np.frombuffer(pcm, dtype="<i2"))


def test_soundfile_reads_the_streamed_wav_whole(streams, pcm):
    samples, rate = sf.read(io.BytesIO(body(streams, "wav")), dtype="int16")
    assert rate == SR and np.array_equal(samples, np.frombuffer(pcm, dtype="<i2"))


def test_soundfile_reads_the_streamed_flac_up_to_its_unknown_end(streams, pcm):
    """STREAMINFO says 0 samples (unknown), which libsndfile takes for 2**63 - 1 frames: a
    whole-file sf.read() cannot size its array, and the read that meets the end fails its
    seek; every block before the end reads exactly."""
    with sf.SoundFile(io.BytesIO(body(streams, "flac"))) as flac:
        assert (flac.samplerate, flac.channels, flac.subtype) == (SR, 1, "PCM_16")
        assert flac.frames == 2**63 - 1
        head = np.concatenate([flac.read(SR, dtype="int16") for _ in range(int(SECONDS) - 1)])
    assert np.array_equal(head, np.frombuffer(pcm, dtype="<i2")[: head.size])


def test_wav_header_is_the_streaming_form(streams):
    header = body(streams, "wav")[:44]
    assert header == wav_header(SR)
    riff, riff_size, wave, fmt_id, fmt_size, codec, channels, rate, byte_rate, align, bits, data_id, data_size = (
        struct.unpack("<4sI4s4sIHHIIHH4sI", header)
    )
    assert (riff, wave, fmt_id, data_id) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert riff_size == data_size == 0xFFFFFFFF
    assert (fmt_size, codec, channels, rate, byte_rate, align, bits) == (16, 1, 1, SR, 2 * SR, 2, 16)


@pytest.mark.parametrize("fmt", RESPONSE_FORMATS)
def test_first_audio_bytes_leave_when_documented(pcm, fmt):
    encoder = open_encoder(fmt)
    header = encoder.feed(b"")  # what the muxer wrote at open
    assert header.startswith(HEADER_MAGIC[fmt]) and bool(header) == bool(HEADER_MAGIC[fmt])
    fed = 0
    for piece in pieces(pcm, 32):
        fed += len(piece) // 2
        if encoder.feed(piece):
            break
    encoder.close()
    assert fed == max(32, FIRST_AUDIO_AFTER[fmt])


@pytest.mark.parametrize("fmt", RESPONSE_FORMATS)
def test_every_chunk_returns_bytes_and_close_returns_little(streams, fmt):
    parts, tail = streams[fmt]
    header = len(wav_header(SR)) if fmt == "wav" else 0
    assert len(parts[0]) > header, "the first 85 ms chunk already yields audio"
    assert all(parts), "no chunk is swallowed: nothing buffers the whole file"
    before_close = sum(map(len, parts))
    assert before_close >= 0.95 * (before_close + len(tail))
    assert len(tail) < 2048


@pytest.mark.parametrize("fmt", RESPONSE_FORMATS)
def test_close_is_idempotent_and_final(fmt):
    encoder = open_encoder(fmt)
    encoder.feed(sine_pcm(0.2))
    encoder.close()
    assert encoder.close() == b""
    with pytest.raises(ValueError, match="after close"):
        encoder.feed(b"\0\0")


@pytest.mark.parametrize("fmt", RESPONSE_FORMATS)
def test_empty_stream_still_makes_a_well_formed_body(fmt):
    encoder = open_encoder(fmt)
    data = encoder.feed(b"") + encoder.feed(b"") + encoder.close()
    assert data.startswith(HEADER_MAGIC[fmt])


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac"])
def test_odd_and_empty_chunks_lose_no_sample(pcm, fmt):
    cuts = [0, 1, 1, 4095, 4095, 7, 3000, 3001]  # odd lengths leave a stray byte to carry
    chunks, at = [], 0
    for i, cut in enumerate(cuts * 100):
        chunks.append(pcm[at:at + cut])
        at += cut
        if i % 5 == 0:
            chunks.append(b"")
    chunks.append(pcm[at:])
    assert b"".join(chunks) == pcm
    parts, tail = encode_stream(fmt, chunks)
    streamed = b"".join(parts) + tail
    if fmt == "pcm":
        assert streamed == pcm
    else:
        samples, _, _ = decode(streamed, fmt)
        assert np.array_equal(samples, np.frombuffer(pcm, dtype="<i2"))


def test_a_stray_last_byte_is_dropped_at_close():
    encoder = open_encoder("pcm")
    assert encoder.feed(b"\1\2\3") == b"\1\2"
    assert encoder.close() == b""


def test_context_manager_closes():
    with open_encoder("mp3") as encoder:
        encoder.feed(sine_pcm(0.2))
    assert encoder.close() == b""


def test_unknown_format_names_the_valid_ones():
    with pytest.raises(ValueError, match="mp3, opus, aac, flac, wav, pcm"):
        open_encoder("ogg")  # type: ignore[arg-type]


def test_import_pulls_in_no_torch_or_vllm():
    code = (
        "import sys, gateway.api, gateway.api.encode, gateway.api.speed\n"
        "print(','.join(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
