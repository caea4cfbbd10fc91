"""bench/train.py's ground truth for head silence (bench/speech.py helpers): the first sample at
-60 dBFS of clean audio, and a trimmed clip located in its upload by exact sample match."""

from __future__ import annotations

import numpy as np

from bench.speech import first_loud_sample, locate


def _upload(head: int = 1200, seed: int = 0) -> np.ndarray:
    speech = np.random.default_rng(seed).uniform(-0.5, 0.5, 4800).astype(np.float32)
    speech[:30] *= np.linspace(0.0, 1.0, 30, dtype=np.float32) * 1e-3  # a soft onset below -60 dBFS
    return np.concatenate([np.zeros(head, np.float32), speech, np.zeros(600, np.float32)])


def test_first_loud_sample_is_the_first_at_minus_60_dbfs():
    audio = np.zeros(100, np.float32)
    audio[40], audio[70] = 5e-4, 2e-3  # -66 dBFS, then -54 dBFS
    assert first_loud_sample(audio) == 70
    assert first_loud_sample((audio * 32768).astype(np.int16)) == 70
    assert first_loud_sample(np.zeros(10, np.float32)) is None


def test_a_faded_cut_is_located_and_gives_the_true_head_silence():
    upload = _upload()
    onset = first_loud_sample(upload)
    start, end = onset - 480, upload.size - 300  # 20 ms kept before speech at 24 kHz
    clip = upload[start:end].copy()
    clip[:120] *= np.linspace(0.0, 1.0, 120, dtype=np.float32)  # trimming fades its ends
    clip[-120:] *= np.linspace(1.0, 0.0, 120, dtype=np.float32)
    assert locate(clip, upload) == start
    assert onset - locate(clip, upload) == 480


def test_a_clip_that_is_not_a_cut_is_not_located():
    assert locate(_upload(seed=1)[1000:3000], _upload(seed=2)) is None
