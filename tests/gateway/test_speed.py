"""gateway.api.speed: atempo changes duration not pitch, holds back what the module docstring
says, and speed 1.0 is an exact passthrough."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from gateway.api import speed as speed_module
from gateway.api.encode import open_encoder
from gateway.api.speed import SpeedChanger, atempo_stages, check_speed
from tests.gateway.test_encode import pieces, sine_pcm  # the same 5 s test signal, 2048-sample chunks

SR = 24000
SECONDS = 5.0
DURATION_SLACK_S = 0.06  # the flush drops part of the last window
# The module docstring's table: (slowest, fastest speed), most input samples held back, and the
# 2048-sample chunk (1-based) whose feed() first returns audio.
HOLD_BACK = [((0.25, 1.25), 1326, 1), ((1.5, 2.5), 2037, 1), ((3.0, 4.0), 2532, 2)]
SPEEDS = [0.25, 0.3, 0.4, 0.5, 0.75, 0.9, 1.1, 1.25, 1.5, 1.9, 2.0, 2.5, 3.0, 3.5, 4.0]


def stretch(speed: float, chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    changer = SpeedChanger(speed)
    parts = [changer.feed(chunk) for chunk in chunks]
    return parts, changer.close()


def peak_hz(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.argmax(spectrum)) * SR / samples.size


@pytest.fixture(scope="module")
def pcm() -> bytes:
    return sine_pcm()


def test_public_names():
    for name in speed_module.__all__:
        assert hasattr(speed_module, name), name


@pytest.mark.parametrize(
    ("speed", "stages"),
    [(0.25, (0.5, 0.5)), (0.4, (0.5, 0.8)), (0.5, (0.5,)), (1.5, (1.5,)), (2.0, (2.0,)), (4.0, (4.0,))],
)
def test_stages_chain_below_half_speed_only(speed, stages):
    assert atempo_stages(speed) == pytest.approx(stages)
    assert np.prod(atempo_stages(speed)) == pytest.approx(speed)


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.75, 1.5, 2.0, 4.0])
def test_duration_scales_and_pitch_stays(pcm, speed):
    parts, tail = stretch(speed, pieces(pcm))
    out = b"".join(parts) + tail
    assert len(out) / 2 / SR == pytest.approx(SECONDS / speed, abs=DURATION_SLACK_S)
    assert peak_hz(out) == pytest.approx(440.0, abs=2.0)


@pytest.mark.parametrize("speed", SPEEDS)
def test_hold_back_is_as_documented(pcm, speed):
    (bound, first_chunk), = [(held, first) for (low, high), held, first in HOLD_BACK if low <= speed <= high]
    changer = SpeedChanger(speed)
    fed = returned = 0
    worst, first_output = 0.0, None
    for index, chunk in enumerate(pieces(pcm), start=1):
        returned += len(changer.feed(chunk)) // 2
        fed += len(chunk) // 2
        worst = max(worst, fed - returned * speed)
        if first_output is None and returned:
            first_output = index
    changer.close()
    assert worst <= bound
    assert first_output == first_chunk


def test_speed_one_is_the_input_byte_for_byte(pcm):
    odd = [pcm[:4095], pcm[4095:9000], b"", pcm[9000:]]
    parts, tail = stretch(1.0, odd)
    assert parts == odd and tail == b""


@pytest.mark.parametrize("bad", [0.2, 4.5, 5, 0, -1, float("nan"), float("inf")])
def test_out_of_range_speeds_are_refused(bad):
    with pytest.raises(ValueError, match=r"speed must be between 0\.25 and 4\.0, got "):
        SpeedChanger(bad)


def test_the_message_shows_the_value_given():
    with pytest.raises(ValueError, match=r"^speed must be between 0\.25 and 4\.0, got 5$"):
        check_speed(5)
    assert check_speed(0.25) == 0.25 and check_speed(4.0) == 4.0


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_close_is_idempotent_and_final(speed):
    changer = SpeedChanger(speed)
    changer.feed(sine_pcm(0.2))
    changer.close()
    assert changer.close() == b""
    with pytest.raises(ValueError, match="after close"):
        changer.feed(b"\0\0")


def test_odd_and_empty_chunks_stretch_like_whole_ones(pcm):
    cuts = [0, 1, 4095, 7, 3001, 0, 2048]
    chunks, at = [], 0
    while at < len(pcm):
        for cut in cuts:
            chunks.append(pcm[at:at + cut])
            at += cut
    parts, tail = stretch(2.0, chunks)
    odd = b"".join(parts) + tail
    even = b"".join(stretch(2.0, pieces(pcm))[0])
    assert len(odd) % 2 == 0
    assert len(odd) / 2 / SR == pytest.approx(SECONDS / 2.0, abs=DURATION_SLACK_S)
    assert len(even) / 2 / SR == pytest.approx(SECONDS / 2.0, abs=DURATION_SLACK_S)
    assert peak_hz(odd) == pytest.approx(440.0, abs=2.0)


def test_context_manager_closes():
    with SpeedChanger(1.5) as changer:
        changer.feed(sine_pcm(0.2))
    assert changer.close() == b""


def test_stretched_audio_encodes_as_a_response(pcm):
    """The endpoint's path: worker PCM -> SpeedChanger -> encoder -> one mp3 body."""
    changer, encoder = SpeedChanger(2.0), open_encoder("mp3")
    body = b"".join(encoder.feed(changer.feed(chunk)) for chunk in pieces(pcm))
    body += encoder.feed(changer.close()) + encoder.close()
    with av.open(io.BytesIO(body), format="mp3") as container:
        decoded = sum(frame.samples for frame in container.decode(audio=0))
    assert decoded / SR == pytest.approx(SECONDS / 2.0, abs=0.1)
