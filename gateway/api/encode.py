"""Streaming encoders for the speech endpoint's `response_format`: mp3, opus, aac, flac, wav, pcm.

The workers' 24 kHz mono s16le PCM goes in chunk by chunk and each `feed` hands back the encoded
bytes that are ready, so the HTTP body streams while the voice is still speaking. Codecs run in
PyAV: libmp3lame as raw MPEG audio, libopus in Ogg, ffmpeg's aac in ADTS, flac as native FLAC.
The muxer writes into a `_Sink` that every call empties: nothing is held beyond what the codec
itself needs, and nothing touches disk. The sink cannot seek, so the rewrites a muxer would make
at the end of a file (mp3's Xing/LAME frame, FLAC's total-samples and MD5) are not made; players
and ffmpeg stream such files fine, but libsndfile takes FLAC's unknown length for 2**63 frames,
so `soundfile.read()` of a flac body fails (wav bodies it reads whole). wav is a RIFF header
whose sizes read 0xFFFFFFFF ("unknown", as a streaming server must send) followed by the PCM;
pcm is the PCM untouched.

When bytes leave, in samples fed at 24 kHz (asserted by tests/gateway/test_encode.py):

    format  header (returned by the first feed)   first audio bytes once this much is fed
    pcm     none                                  1 sample
    wav     44-byte RIFF header                   1 sample
    mp3     none (no ID3 tag, no Xing frame)      1728 samples (72 ms): lame's look-ahead
    opus    OpusHead and OpusTags pages           960 samples (40 ms): two 20 ms packets, as
                                                  Ogg closes a page when the next one arrives
    aac     none (ADTS frames self-describe)      2048 samples (85 ms): 1024 of priming + 1024
    flac    fLaC + STREAMINFO                     1152 samples (48 ms): one block

So with the workers' 2048-sample chunks every format returns audio from the first chunk, as pcm
does; later chunks come back within one codec frame, and `close()` returns only what the codec
still held (about 1 KiB at most).
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType, TracebackType
from typing import Literal, get_args

import av
import numpy as np

__all__ = [
    "MEDIA_TYPES",
    "RESPONSE_FORMATS",
    "AudioEncoder",
    "PcmCarry",
    "ResponseFormat",
    "open_encoder",
    "pcm_frame",
    "wav_header",
]

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = get_args(ResponseFormat)

MEDIA_TYPES: Mapping[ResponseFormat, str] = MappingProxyType({
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
})

_UNKNOWN_SIZE = 0xFFFFFFFF


@dataclass(frozen=True)
class _CodecSpec:
    """How one compressed format is made: an ffmpeg muxer, an encoder, and the options that make
    them emit as soon as they can."""

    muxer: str
    codec: str
    bit_rate: int | None  # None: lossless
    muxer_options: Mapping[str, str] = field(default_factory=dict)
    codec_options: Mapping[str, str] = field(default_factory=dict)


_CODECS: Mapping[ResponseFormat, _CodecSpec] = MappingProxyType({
    # The Xing/LAME frame is a placeholder filled in by seeking back at the end; an ID3 tag would
    # only put ffmpeg's name before the first frame.
    "mp3": _CodecSpec("mp3", "libmp3lame", 64_000, {"write_xing": "0", "id3v2_version": "0"}),
    # page_duration is in µs: by default the Ogg muxer fills ~1 s pages before writing any.
    "opus": _CodecSpec("ogg", "libopus", 32_000, {"page_duration": "20000"}),
    "aac": _CodecSpec("adts", "aac", 64_000),
    # 48 ms blocks instead of the default 96 ms, so the first block leaves with the first 85 ms
    # chunk; the 8 KiB padding block only serves later in-place tag edits.
    "flac": _CodecSpec("flac", "flac", None, {"metadata_header_padding": "0"}, {"frame_size": "1152"}),
})


@dataclass
class PcmCarry:
    """Keeps a chunk's stray trailing byte for the next chunk, so only whole s16 samples go on."""

    _odd: bytes = b""

    def whole(self, pcm: bytes) -> bytes:
        """The whole samples of what was carried plus `pcm`; a last odd byte waits for more."""
        data = self._odd + pcm if self._odd else pcm
        cut = len(data) - len(data) % 2
        self._odd = data[cut:]
        return data if cut == len(data) else data[:cut]


def pcm_frame(samples: bytes, sample_rate: int, pts: int) -> av.AudioFrame:
    """A mono s16 PyAV frame over whole samples, stamped in samples (time base 1/sample_rate)."""
    array = np.frombuffer(samples, dtype="<i2").reshape(1, -1)  # [1, n]
    frame = av.AudioFrame.from_ndarray(array, format="s16", layout="mono")
    frame.sample_rate = sample_rate
    frame.time_base = Fraction(1, sample_rate)
    frame.pts = pts
    return frame


def wav_header(sample_rate: int) -> bytes:
    """RIFF/WAVE header for mono PCM16 of a length not known yet: both sizes read 0xFFFFFFFF."""
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", _UNKNOWN_SIZE, b"WAVE",
        b"fmt ", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16,  # PCM, mono, byte rate, align, bits
        b"data", _UNKNOWN_SIZE,
    )


class AudioEncoder(ABC):
    """One response body being encoded: `feed` PCM as it arrives, `close` once at the end.

    As a context manager it closes on exit, discarding the tail: call `close()` inside the block
    to send it; the exit then only releases what an error left open.
    """

    def __init__(self) -> None:
        self._carry = PcmCarry()
        self._closed = False

    def feed(self, pcm: bytes) -> bytes:
        """Encode s16le PCM of any length; return the bytes ready now, possibly b""."""
        if self._closed:
            raise ValueError("feed() after close(): open a new encoder for each response")
        return self._encode(self._carry.whole(pcm))

    def close(self) -> bytes:
        """Flush the codec and return the rest of the file; later calls return b"".

        A stray odd byte still carried is dropped: half a sample cannot be encoded.
        """
        if self._closed:
            return b""
        self._closed = True
        return self._finish()

    def __enter__(self) -> AudioEncoder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @abstractmethod
    def _encode(self, samples: bytes) -> bytes:
        """Encode whole samples (maybe none); return the bytes ready now."""

    @abstractmethod
    def _finish(self) -> bytes:
        """Flush and release everything; return the last bytes."""


class _RawEncoder(AudioEncoder):
    """pcm and wav: the samples as they came, after a header (empty for pcm)."""

    def __init__(self, header: bytes) -> None:
        super().__init__()
        self._header = header

    def _encode(self, samples: bytes) -> bytes:
        if not self._header:
            return samples
        out, self._header = self._header + samples, b""
        return out

    def _finish(self) -> bytes:
        return self._encode(b"")


class _Sink:
    """Write-only file object for PyAV. Having no seek() it reads as unseekable, which turns off
    the muxers' end-of-file rewrites; what the muxer wrote waits here until taken."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buffer)
        self._buffer.clear()
        return out


class _CodecEncoder(AudioEncoder):
    """mp3, opus, aac, flac: a PyAV encoder and muxer writing into a `_Sink`."""

    def __init__(self, spec: _CodecSpec, sample_rate: int) -> None:
        super().__init__()
        self._sample_rate = sample_rate
        self._pts = 0
        self._sink = _Sink()
        options = {"flush_packets": "1", **spec.muxer_options}  # hand each packet to the sink at once
        self._container = av.open(self._sink, "w", format=spec.muxer, container_options=options)
        try:
            self._stream = self._container.add_stream(
                spec.codec, rate=sample_rate, layout="mono", options=dict(spec.codec_options)
            )
            if spec.bit_rate is not None:
                self._stream.codec_context.bit_rate = spec.bit_rate
            # Opens the codec and writes the header now: a setting the codec rejects fails here,
            # before the endpoint has sent a status line.
            self._container.start_encoding()
        except BaseException:
            self._container.close()
            raise

    def _encode(self, samples: bytes) -> bytes:
        if samples:
            frame = pcm_frame(samples, self._sample_rate, self._pts)
            self._pts += frame.samples
            self._container.mux(self._stream.encode(frame))
        return self._sink.take()

    def _finish(self) -> bytes:
        try:
            self._container.mux(self._stream.encode(None))
        finally:
            self._container.close()
        return self._sink.take()


def open_encoder(fmt: ResponseFormat, sample_rate: int = 24000) -> AudioEncoder:
    """A fresh encoder for one response of mono s16le PCM at `sample_rate`.

    ValueError for a format outside RESPONSE_FORMATS; a PyAV error when the codec refuses the
    rate (libopus takes 8, 12, 16, 24 or 48 kHz).
    """
    if fmt not in RESPONSE_FORMATS:
        raise ValueError(f"unknown response_format {fmt!r}: choose one of {', '.join(RESPONSE_FORMATS)}")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive number of Hz, got {sample_rate}")
    if fmt == "pcm":
        return _RawEncoder(b"")
    if fmt == "wav":
        return _RawEncoder(wav_header(sample_rate))
    return _CodecEncoder(_CODECS[fmt], sample_rate)
