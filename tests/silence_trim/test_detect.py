"""Measuring leading/trailing silence of real speech with known padding, clean and noisy."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from silence_trim import measure
from tests.fixtures.speech import pad_silence, speech_edges, white_noise
from tests.silence_trim.conftest import PADS_MS, make_case

SR = 24000


def errors(cases, detector, vad=None):
    """(measured - true) leading and trailing silence, ms, per case."""
    out = []
    for case in cases:
        report = measure(case.audio, SR, detector, vad=vad)
        assert report.has_speech, case.label
        out.append((report.leading_silence_ms - case.leading_ms, report.trailing_silence_ms - case.trailing_ms, case.label))
    return out


def assert_within(errs, lead_ms, tail_ms=None):
    worst_lead = max(errs, key=lambda e: abs(e[0]))
    assert abs(worst_lead[0]) <= lead_ms, worst_lead
    if tail_ms is not None:
        worst_tail = max(errs, key=lambda e: abs(e[1]))
        assert abs(worst_tail[1]) <= tail_ms, worst_tail


@pytest.mark.parametrize("noise", ["clean", "white-60", "dc", "hum-30"])
def test_energy_detector_within_20_ms_on_clean_and_quiet_floors(clips, noise):
    cases = [make_case(c, pad, noise, tail_ms=pad / 2, seed=i) for i, c in enumerate(clips) for pad in PADS_MS]
    errs = errors(cases, "energy")
    assert_within(errs, lead_ms=20.0, tail_ms=20.0 if noise in ("clean", "dc") else None)


@pytest.mark.parametrize("noise", ["white-60", "white-45", "hum-30"])
def test_vad_within_40_ms_on_noisy_audio(clips, vad, noise):
    cases = [make_case(c, pad, noise, seed=i) for i, c in enumerate(clips[:16]) for pad in PADS_MS]
    assert_within(errors(cases, "vad", vad), lead_ms=40.0)


def test_vad_within_20_ms_on_clean_audio(clips, vad):
    cases = [make_case(c, pad, "clean", tail_ms=pad / 2) for c in clips[:8] for pad in PADS_MS]
    assert_within(errors(cases, "vad", vad), lead_ms=20.0, tail_ms=20.0)


def test_energy_detector_finds_no_silence_under_a_loud_noise_floor(clip):
    """Documented limit: above off_db every frame is active, so nothing is called silence."""
    case = make_case(clip, 600, "white-45")
    report = measure(case.audio, SR, "energy")
    assert report.leading_silence_ms < case.leading_ms  # it errs towards keeping audio


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
@pytest.mark.parametrize("detector", ["energy", "vad"])
def test_any_sample_rate(clip, vad, rate, detector):
    resampled = soxr.resample(clip.astype(np.float64) / 32768.0, SR, rate)
    padded = pad_silence(resampled, rate, 600)
    truth = 600 + 1000.0 * speech_edges(resampled)[0] / rate
    report = measure(padded, rate, detector, vad=vad)
    assert abs(report.leading_silence_ms - truth) <= 20.0, report


def test_int16_and_float_give_the_same_report(clip):
    padded = pad_silence(clip, SR, 100)
    assert measure(padded, SR) == measure(padded.astype(np.float32) / 32768.0, SR)


def test_report_fields_are_consistent(clip):
    report = measure(pad_silence(clip, SR, 600, 400), SR)
    d = report.to_dict()
    assert set(d) >= {"leading_silence_ms", "trailing_silence_ms", "speech_ms", "detector"}
    assert report.detector == "energy" and report.has_speech
    assert report.leading_silence_ms + report.speech_ms + report.trailing_silence_ms == pytest.approx(report.duration_ms)


@pytest.mark.parametrize("detector", ["energy", "vad"])
def test_all_silence_and_empty_audio_have_no_speech(vad, detector):
    for audio in (np.zeros(SR, dtype=np.int16), white_noise(SR, -70.0), np.zeros(0, dtype=np.float32), np.zeros(5)):
        report = measure(audio, SR, detector, vad=vad)
        assert not report.has_speech and report.speech_ms == 0.0
        assert report.leading_silence_ms == report.trailing_silence_ms == report.duration_ms


@pytest.mark.parametrize("detector", ["energy", "vad"])
def test_a_click_is_not_speech(vad, detector):
    audio = np.zeros(SR)
    audio[SR // 2 : SR // 2 + 24] = 0.8  # 1 ms at -2 dBFS
    assert not measure(audio, SR, detector, vad=vad).has_speech
