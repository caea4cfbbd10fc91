"""Silence trimming figures: detector speed and accuracy on espeak-ng speech, streaming gate cost.

`run()` returns one flat dict (printed by `voicering bench silence --json`). Speech comes from
espeak-ng + sox as in the tests (tests/fixtures/speech.py, which an installed `voicering` cannot
import), padded with known head silence; the peer is silero-vad's own `get_speech_timestamps`
(its torch JIT model, default settings) on the same clips, when torch is importable.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from bench.speech import VOICES, pad_silence, synthesize
from lora_training.espeak import HARVARD_SENTENCES
from silence_trim import SileroVad, StreamOptions, StreamTrimmer, measure

SR = 24000
HEAD_MS = 600  # an Orpheus base voice's typical generated head silence
CHUNK = 2048  # one SNAC frame
# the figures' clips: twelve Harvard sentences and four more, both espeak-ng voices alternating
SENTENCES = tuple(HARVARD_SENTENCES[i] for i in (*range(12), 16, 22, 25, 29))


def speech_edges(audio: np.ndarray) -> tuple[int, int]:
    """First and last sample reaching -60 dBFS (the truth the tests use)."""
    loud = np.flatnonzero(np.abs(audio.astype(np.float64) / 32768.0) >= 1e-3)
    return int(loud[0]), int(loud[-1])


def white_noise(n: int, dbfs: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n) * 10 ** (dbfs / 20)


def _corpus(seconds: float, folder: Path) -> list[np.ndarray]:
    clips, total, i = [], 0.0, 0
    while total < seconds:
        text, voice = SENTENCES[i % len(SENTENCES)], VOICES[i % len(VOICES)]
        if i < len(SENTENCES):
            clips.append(sf.read(str(synthesize(text, voice, folder / f"{i:03d}.wav")), dtype="int16")[0])
        else:
            clips.append(clips[i % len(SENTENCES)])
        total += clips[-1].size / SR + HEAD_MS / 1000
        i += 1
    return clips


def _lead_truth_ms(clip: np.ndarray) -> float:
    return HEAD_MS + 1000.0 * speech_edges(clip)[0] / SR


def _measure_speed_and_error(clips, padded, detector, vad=None) -> tuple[float, float, float]:
    start, errors = time.perf_counter(), []
    for clip, audio in zip(clips, padded):
        report = measure(audio, SR, detector, vad=vad)
        errors.append(report.leading_silence_ms - _lead_truth_ms(clip))
    elapsed = time.perf_counter() - start
    seconds = sum(a.shape[0] for a in padded) / SR
    err = np.abs(errors)
    return 1000.0 * elapsed / seconds, float(err.mean()), float(err.max())


def _stream_figures(clips, detector, vad=None) -> dict:
    holding, passing, delays = [], [], []
    for clip in clips[:12]:
        audio = pad_silence(clip, SR, HEAD_MS)
        trimmer = StreamTrimmer(SR, StreamOptions(detector=detector), vad=vad)
        for i in range(0, audio.size, CHUNK):
            chunk = audio[i : i + CHUNK].tobytes()
            was_passing = trimmer.passing
            t0 = time.perf_counter()
            trimmer.push(chunk)
            (passing if was_passing else holding).append(time.perf_counter() - t0)
        trimmer.flush()
        delays.append(trimmer.result.released_at_ms - _lead_truth_ms(clip))
    return {
        f"stream_{detector}_push_us_holding_mean": round(1e6 * float(np.mean(holding)), 1),
        f"stream_{detector}_push_us_passing_mean": round(1e6 * float(np.mean(passing)), 2),
        f"stream_{detector}_release_after_speech_ms_mean": round(float(np.mean(delays)), 1),
    }


def _silero_reference(clips, padded) -> dict:
    """silero-vad's own pipeline (torch JIT model, get_speech_timestamps defaults) as the peer."""
    try:
        import soxr
        import torch
        from silero_vad import get_speech_timestamps, load_silero_vad
    except Exception as err:  # torch or the silero package may be absent: report, don't fail
        return {"peer_silero_timestamps_error": f"{type(err).__name__}: {err}"}
    torch.set_num_threads(1)
    model = load_silero_vad()
    start, errors = time.perf_counter(), []
    for clip, audio in zip(clips, padded):
        audio16 = torch.from_numpy(soxr.resample(audio.astype(np.float32) / 32768.0, SR, 16000))
        stamps = get_speech_timestamps(audio16, model, sampling_rate=16000)
        lead = 1000.0 * stamps[0]["start"] / 16000 if stamps else float("nan")
        errors.append(lead - _lead_truth_ms(clip))
    elapsed = time.perf_counter() - start
    err = np.abs(errors)
    return {
        "peer_silero_timestamps_ms_per_audio_s": round(1000.0 * elapsed / (sum(a.size for a in padded) / SR), 2),
        "peer_silero_timestamps_lead_error_ms_mean": round(float(np.nanmean(err)), 1),
        "peer_silero_timestamps_lead_error_ms_max": round(float(np.nanmax(err)), 1),
        "peer_silero_timestamps_lead_error_ms_signed_mean": round(float(np.nanmean(errors)), 1),  # its 30 ms pad
    }


def run(seconds: float = 60.0) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        clips = _corpus(seconds, Path(folder))
    padded = [pad_silence(c, SR, HEAD_MS) for c in clips]
    noisy = [p.astype(np.float64) / 32768.0 + white_noise(p.size, -45.0, seed=i) for i, p in enumerate(padded)]
    vad = SileroVad()
    figures: dict = {
        "audio_seconds": round(sum(p.size for p in padded) / SR, 1),
        "clips": len(clips),
        "head_silence_ms": HEAD_MS,
    }
    for name, detector, audio, model in (
        ("energy_clean", "energy", padded, None),
        ("vad_clean", "vad", padded, vad),
        ("vad_noise45", "vad", noisy, vad),
    ):
        speed, mean_err, max_err = _measure_speed_and_error(clips, audio, detector, model)
        figures[f"{name}_ms_per_audio_s"] = round(speed, 2)
        figures[f"{name}_lead_error_ms_mean"] = round(mean_err, 1)
        figures[f"{name}_lead_error_ms_max"] = round(max_err, 1)
    figures.update(_stream_figures(clips, "energy"))
    figures.update(_stream_figures(clips, "vad", vad))
    figures.update(_silero_reference(clips, padded))
    return figures


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2, sort_keys=True))
