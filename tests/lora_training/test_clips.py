"""Clip trimming with silence_trim: head silence down to the margin, with either detector."""

import numpy as np
import pytest

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.clips import Clip, ClipSet, trim_clip
from lora_training.settings import DataParams
from tests.fixtures.speech import pad_silence, white_noise


def test_energy_trim_cuts_600ms_of_silence_to_the_margin(speech_corpus):
    audio = pad_silence(speech_corpus[0].load(), SAMPLE_RATE, 600, 400).astype(np.float32) / 32768
    trimmed = trim_clip(audio, DataParams())
    assert trimmed.has_speech and trimmed.head_before_ms >= 600 and trimmed.head_after_ms <= 20.0
    assert trimmed.audio.size < audio.size - 0.55 * SAMPLE_RATE


def test_vad_trim_works_on_noisy_recordings(speech_corpus):
    pytest.importorskip("onnxruntime")
    from silence_trim.vad import SileroVad

    clean = pad_silence(speech_corpus[1].load(), SAMPLE_RATE, 600).astype(np.float64) / 32768
    noisy = (clean + white_noise(clean.size, -45.0, seed=1)).astype(np.float32)
    assert trim_clip(noisy, DataParams()).audio.size == noisy.size  # the energy detector sees no silence in noise
    trimmed = trim_clip(noisy, DataParams(trim_detector="vad"), vad=SileroVad())
    assert trimmed.head_before_ms >= 550 and trimmed.head_after_ms <= 25.0


def test_a_clip_set_round_trips_through_its_cache_directory(tmp_path):
    rng = np.random.default_rng(0)
    clips = (Clip("a-0000", "a.wav", "one", rng.standard_normal(4800).astype(np.float32), 600.0, 20.0),
             Clip("a-0001", "a.wav", "two", rng.standard_normal(2400).astype(np.float32), 310.0, 20.0))
    ClipSet(clips, {"clips": 2}).save(tmp_path / "set")
    loaded = ClipSet.load(tmp_path / "set")
    assert [c.meta() for c in loaded.clips] == [c.meta() for c in clips]
    assert all(np.array_equal(a.audio, b.audio) for a, b in zip(loaded.clips, clips, strict=True))
    assert ClipSet.load(tmp_path / "missing") is None
    (tmp_path / "set" / "audio" / "a-0001.wav").unlink()
    assert ClipSet.load(tmp_path / "set") is None  # incomplete: rebuilt, never half-used
