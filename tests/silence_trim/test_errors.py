"""Bad input fails with a clear message of what to do; nothing crashes on odd but valid input."""

from __future__ import annotations

import numpy as np
import pytest

from silence_trim import (
    ChannelLayoutError,
    EnergyParams,
    InvalidAudioError,
    InvalidOptionsError,
    NonFiniteAudioError,
    SilenceTrimError,
    SileroVad,
    TrimOptions,
    UnsupportedDtypeError,
    VadParams,
    VadUnavailableError,
    make_detector,
    measure,
    trim,
)

SR = 24000


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_samples_are_rejected(bad):
    audio = np.zeros(SR, dtype=np.float32)
    audio[1234] = bad
    with pytest.raises(NonFiniteAudioError, match=r"1 sample\(s\) that are NaN or infinite \(first at sample 1234\)"):
        measure(audio, SR)
    with pytest.raises(NonFiniteAudioError):
        trim(audio, SR)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int64, np.complex64, bool, object])
def test_wrong_dtype_is_rejected(dtype):
    with pytest.raises(UnsupportedDtypeError, match="pass int16 or int32 PCM, or float32/float64"):
        measure(np.zeros(100, dtype=dtype), SR)


def test_int32_pcm_is_accepted():
    audio = np.zeros(SR, dtype=np.int32)
    audio[SR // 2 :] = (np.sin(np.arange(SR // 2) * 0.3) * 2**30).astype(np.int32)
    assert measure(audio, SR).leading_silence_ms == pytest.approx(500.0, abs=5.0)


def test_stereo_is_rejected_unless_downmixed():
    stereo = np.zeros((SR, 2), dtype=np.int16)
    with pytest.raises(ChannelLayoutError, match="audio is stereo: pass mono or set downmix=True"):
        measure(stereo, SR)
    assert not measure(stereo, SR, downmix=True).has_speech
    assert not measure(np.zeros((SR, 1), dtype=np.int16), SR).has_speech  # one channel is mono


def test_channel_first_and_3d_arrays_are_rejected_with_a_hint():
    with pytest.raises(ChannelLayoutError, match=r"\(samples, channels\).*pass audio.T"):
        measure(np.zeros((2, SR), dtype=np.float32), SR, downmix=True)
    with pytest.raises(ChannelLayoutError, match="1-D"):
        measure(np.zeros((2, 2, 2), dtype=np.float32), SR)
    with pytest.raises(ChannelLayoutError):
        measure(np.float32(0.0), SR)


@pytest.mark.parametrize("rate", [0, -16000, 16000.5, True])
def test_bad_sample_rate(rate):
    with pytest.raises(InvalidAudioError, match="sample rate must be a positive integer"):
        measure(np.zeros(100, dtype=np.int16), rate)


def test_bad_options():
    with pytest.raises(InvalidOptionsError, match="unknown detector 'webrtc'"):
        make_detector("webrtc", SR)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionsError, match="off_db"):
        EnergyParams(on_db=-60, off_db=-50)
    with pytest.raises(InvalidOptionsError, match="neg_threshold"):
        VadParams(threshold=0.3, neg_threshold=0.5)
    with pytest.raises(InvalidOptionsError, match="reach into speech"):
        TrimOptions(margin_ms=3, fade_ms=5)
    with pytest.raises(InvalidOptionsError):
        TrimOptions(margin_ms=-1)


def test_a_missing_model_file_is_a_clear_error(tmp_path):
    with pytest.raises(VadUnavailableError, match="cannot load the VAD model"):
        SileroVad(tmp_path / "nope.onnx")


def test_every_error_is_a_silence_trim_error_and_a_value_error():
    for error in (InvalidAudioError, NonFiniteAudioError, ChannelLayoutError, VadUnavailableError, InvalidOptionsError):
        assert issubclass(error, SilenceTrimError) and issubclass(error, ValueError)
