"""Decoding uploads of every accepted format to 24 kHz mono, and refusing unusable audio."""

from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from lora_training.errors import AudioError, SpeechAmountError
from lora_training.ingest import check_speech_total, ingest
from lora_training.settings import DataParams

DATA = DataParams()


def _speechlike(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    """A vowel-like tone with a slow envelope, [n, channels] float32."""
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return np.repeat(x[:, None], channels, axis=1).astype(np.float32)


def _write_m4a(path: Path, x: np.ndarray, rate: int) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=rate, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x.T), format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)


@pytest.mark.parametrize(("suffix", "rate", "channels", "kwargs"), [
    ("wav", 44_100, 2, {"subtype": "PCM_16"}),
    ("flac", 48_000, 1, {}),
    ("mp3", 44_100, 1, {"format": "MP3"}),
    ("ogg", 48_000, 1, {"format": "OGG", "subtype": "OPUS"}),
    ("m4a", 44_100, 2, None),
])
def test_formats_rates_and_channels_become_24k_mono(tmp_path, suffix, rate, channels, kwargs):
    x = _speechlike(2.0, rate, channels)
    path = tmp_path / f"take.{suffix}"
    if kwargs is None:
        _write_m4a(path, x, rate)
    else:
        sf.write(str(path), x, rate, **kwargs)
    recording = ingest(path, DATA)
    assert recording.audio.dtype == np.float32 and recording.audio.ndim == 1
    assert recording.source_rate == rate and recording.channels == channels
    assert abs(recording.duration_s - 2.0) < 0.1  # codec priming/padding adds a little
    assert 0.2 < np.abs(recording.audio).max() < 0.6


def test_corrupt_file_is_refused_with_its_name(tmp_path):
    path = tmp_path / "broken.wav"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage" + bytes(range(256)) * 4)
    with pytest.raises(AudioError, match="broken.wav: not a readable audio file"):
        ingest(path, DATA)


def test_low_sample_rate_clipping_and_silence_are_refused(tmp_path):
    low = tmp_path / "phone.wav"
    sf.write(str(low), _speechlike(2.0, 8000), 8000)
    with pytest.raises(AudioError, match="8000 Hz is below 16000 Hz"):
        ingest(low, DATA)
    clipped = tmp_path / "loud.wav"
    sf.write(str(clipped), np.clip(_speechlike(2.0, 24000) * 10, -1, 1), 24000)
    with pytest.raises(AudioError, match="clipping"):
        ingest(clipped, DATA)
    silent = tmp_path / "silent.wav"
    sf.write(str(silent), np.zeros(24000 * 5, dtype=np.float32), 24000)
    with pytest.raises(AudioError, match="near-silent"):
        ingest(silent, DATA)


def test_speech_totals_have_bounds_and_advice():
    with pytest.raises(SpeechAmountError, match="only 10 s .* at least 60 s .* about 10 minutes"):
        check_speech_total(10.0, DATA)
    with pytest.raises(SpeechAmountError, match="limit is 30 minutes"):
        check_speech_total(31 * 60.0, DATA)
    check_speech_total(600.0, DATA)
