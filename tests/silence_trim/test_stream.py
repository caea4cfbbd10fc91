"""The streaming trimmer on a PCM16 24 kHz stream: equal to offline trim, bounded, cheap once passing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from silence_trim import (
    ChannelLayoutError,
    InvalidAudioError,
    InvalidOptionsError,
    StreamClosedError,
    StreamOptions,
    StreamTrimmer,
    TrimOptions,
    trim,
)
from tests.fixtures.speech import pad_silence
from tests.silence_trim.conftest import PADS_MS, make_case

SR = 24000
SNAC_FRAME = 2048


def stream(audio, chunk_sizes, options=None, vad=None, as_bytes=True):
    """Push `audio` in chunks (cycling through `chunk_sizes`), flush; returns (output, trimmer)."""
    trimmer = StreamTrimmer(SR, options, vad=vad)
    out, start, i = [], 0, 0
    data = audio.tobytes() if as_bytes else audio
    unit = audio.itemsize if as_bytes else 1
    while start < len(data):
        size = chunk_sizes[i % len(chunk_sizes)] * unit if chunk_sizes else len(data)
        out.append(trimmer.push(data[start : start + size]))
        start, i = start + size, i + 1
    out.append(trimmer.flush())
    if as_bytes:
        return np.frombuffer(b"".join(out), dtype=np.int16), trimmer
    return np.concatenate(out), trimmer


@pytest.mark.parametrize("detector", ["energy", "vad"])
def test_streaming_equals_offline_trim(clips, vad, detector):
    for c in clips[:6]:
        for pad in PADS_MS:
            audio = pad_silence(c, SR, pad, 300)
            offline = trim(audio, SR, TrimOptions(detector=detector, tail=False), vad=vad)
            streamed, trimmer = stream(audio, [SNAC_FRAME], StreamOptions(detector=detector), vad=vad)
            assert np.array_equal(streamed, offline.audio), (detector, pad)
            assert trimmer.result.outcome == "speech"
            assert trimmer.result.dropped_ms == offline.removed_head_ms


@pytest.mark.parametrize("noise", ["white-60", "white-45", "hum-30"])
def test_streaming_equals_offline_on_noisy_float_streams_with_the_vad(clip, vad, noise):
    case = make_case(clip, 600, noise)
    offline = trim(case.audio, SR, TrimOptions(detector="vad", tail=False), vad=vad)
    streamed, _ = stream(case.audio, [1000, 3001, 17], StreamOptions(detector="vad"), vad=vad, as_bytes=False)
    assert np.array_equal(streamed, offline.audio)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=6000), min_size=1, max_size=8),
    pad=st.sampled_from([0, 100, 600, 1500, 1800]),
)
def test_any_chunking_gives_the_same_stream(clip, sizes, pad):
    audio = pad_silence(clip, SR, pad, 100)
    whole, first = stream(audio, [])
    chunked, second = stream(audio, sizes)
    assert np.array_equal(chunked, whole)
    assert (first.result.outcome, first.result.dropped_samples) == (second.result.outcome, second.result.dropped_samples)


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=40000), max_size=10))
def test_odd_byte_splits_are_reassembled(clip, cuts):
    audio = pad_silence(clip, SR, 600)
    data = audio.tobytes()
    trimmer = StreamTrimmer(SR)
    bounds = [0, *sorted(c % len(data) for c in cuts), len(data)]
    out = b"".join(trimmer.push(data[a:b]) for a, b in zip(bounds, bounds[1:])) + trimmer.flush()
    assert out == trim(audio, SR, TrimOptions(tail=False)).audio.tobytes()


def test_holds_back_until_speech_then_passes_chunks_through_as_is(clip):
    audio = pad_silence(clip, SR, 1000)
    trimmer = StreamTrimmer(SR)
    chunks = [audio[i : i + SNAC_FRAME].tobytes() for i in range(0, audio.size, SNAC_FRAME)]
    outputs = [trimmer.push(chunk) for chunk in chunks]
    first = next(i for i, out in enumerate(outputs) if out)
    assert all(out == b"" for out in outputs[:first])
    assert first * SNAC_FRAME < (1000 + 12 + 40 + 85.4) * SR / 1000  # released within a frame of confirmation
    assert all(out is chunk for out, chunk in zip(outputs[first + 1 :], chunks[first + 1 :]))
    assert trimmer.flush() == b""
    assert trimmer.result.outcome == "speech" and trimmer.result.dropped_ms == pytest.approx(1000 + 12 - 20, abs=5)


def test_never_drops_more_than_max_drop(clip):
    audio = pad_silence(clip, SR, 2500)
    out, trimmer = stream(audio, [SNAC_FRAME])
    assert trimmer.result.outcome == "max_drop" and trimmer.result.dropped_samples == 36000  # 1.5 s
    assert np.array_equal(out[round(0.005 * SR) :], audio[36000 + round(0.005 * SR) :])


def test_a_quiet_voice_is_never_muted(clip):
    """Speech below the energy detector's trigger level: at most max_drop is lost, the rest passes."""
    quiet = (pad_silence(clip, SR, 200).astype(np.float64) * 10 ** (-42 / 20)).astype(np.float32) / 32768
    out, trimmer = stream(quiet, [SNAC_FRAME], as_bytes=False)
    assert trimmer.result.dropped_ms <= 1500.0
    assert out.size >= quiet.size - 36000
    assert np.array_equal(out[120:], quiet[quiet.size - out.size + 120 :])


def test_a_loud_noise_floor_is_held_at_most_max_hold_and_nothing_is_dropped(clip):
    case = make_case(clip, 2500, "white-45")
    out, trimmer = stream(case.audio, [SNAC_FRAME], as_bytes=False)
    assert trimmer.result.outcome == "max_hold" and trimmer.result.released_at_ms == 2000.0
    assert trimmer.result.dropped_samples == 0 and np.array_equal(out, case.audio)


def test_all_silence_stream_drops_at_most_max_drop():
    out, trimmer = stream(np.zeros(SR, dtype=np.int16), [SNAC_FRAME])
    assert trimmer.result.outcome == "end_of_stream"
    assert trimmer.result.dropped_ms == 980.0 and out.size == round(0.02 * SR)
    out, trimmer = stream(np.zeros(3 * SR, dtype=np.int16), [SNAC_FRAME])
    assert trimmer.result.dropped_ms == 1500.0 and out.size == 3 * SR - 36000


def test_empty_stream_and_empty_chunks():
    trimmer = StreamTrimmer(SR)
    assert trimmer.push(b"") == b"" and trimmer.flush() == b""
    assert trimmer.result.outcome == "end_of_stream" and trimmer.result.dropped_samples == 0


def test_bad_chunks_and_misuse_are_clear_errors():
    trimmer = StreamTrimmer(SR)
    with pytest.raises(ChannelLayoutError, match="mono"):
        trimmer.push(np.zeros((2048, 2), dtype=np.int16))
    trimmer = StreamTrimmer(SR)
    trimmer.push(np.zeros(10, dtype=np.int16))
    with pytest.raises(InvalidAudioError, match="one kind of chunk"):
        trimmer.push(b"\x00\x00")
    with pytest.raises(InvalidAudioError, match="NaN"):
        StreamTrimmer(SR).push(np.array([0.0, np.nan], dtype=np.float32))
    with pytest.raises(InvalidAudioError, match="dtype"):
        StreamTrimmer(SR).push(np.zeros(4, dtype=np.uint8))
    trimmer.flush()
    with pytest.raises(StreamClosedError):
        trimmer.push(b"\x00\x00")
    with pytest.raises(InvalidOptionsError, match="max_hold_ms"):
        StreamOptions(max_drop_ms=1500, max_hold_ms=1000)
    with pytest.raises(InvalidOptionsError, match="fade_ms"):
        StreamOptions(margin_ms=2, fade_ms=5)
    with pytest.raises(InvalidOptionsError, match="needs a SileroVad"):
        StreamTrimmer(SR, StreamOptions(detector="vad"))  # never one model session per stream
