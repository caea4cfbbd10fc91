"""Streaming SNAC decode: voicering's windowed decoder vs the reference Orpheus strategy, same model,
same frames, same run.

Reference strategy (orpheus-speech): wait for 28 tokens (4 frames), then for every new frame decode
the last 4 frames and keep samples [2048:4096] (the second frame of the window); it never emits
the first frame or the last two. Both strategies use our position-indexed noise, so the reference's
SNR here is its best case (the real one also draws fresh noise per call).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from gpu_worker.orpheus import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME, Frame

REFERENCE_WINDOW = 4


def _random_frames(n: int, seed: int) -> list[Frame]:
    rng = np.random.default_rng(seed)
    return [Frame(int(rng.integers(4096)), tuple(int(x) for x in rng.integers(4096, size=2)),
                  tuple(int(x) for x in rng.integers(4096, size=4))) for _ in range(n)]


def _snr_db(test: np.ndarray, ref: np.ndarray) -> float:
    return round(float(10 * np.log10((ref**2).sum() / max(((test - ref) ** 2).sum(), 1e-20))), 2)


def _ours(codec, frames: list[Frame]) -> tuple[np.ndarray, float, int]:
    from gpu_worker.codec import StreamingDecoder

    decoder = StreamingDecoder(codec)
    chunks, first_at, decode_s = [], None, 0.0
    for i, frame in enumerate(frames):
        t = time.perf_counter()
        chunk = decoder.push(frame)
        if chunk is not None:
            decode_s += time.perf_counter() - t
            chunks.append(chunk)
            first_at = first_at if first_at is not None else (i + 1) * FRAME_TOKENS
    t = time.perf_counter()
    tail = decoder.flush()
    decode_s += time.perf_counter() - t
    if tail is not None:
        chunks.append(tail)
    return np.concatenate(chunks), decode_s, first_at or len(frames) * FRAME_TOKENS


def _reference(codec, frames: list[Frame]) -> tuple[np.ndarray, list[int], float]:
    chunks, emitted, decode_s = [], [], 0.0
    for i in range(REFERENCE_WINDOW - 1, len(frames)):
        start = i - REFERENCE_WINDOW + 1
        t = time.perf_counter()
        audio = codec.decode_frames(frames[start:i + 1], latent_offset=start * 4)
        decode_s += time.perf_counter() - t
        chunks.append(audio[SAMPLES_PER_FRAME:2 * SAMPLES_PER_FRAME])
        emitted.append(start + 1)
    return np.concatenate(chunks), emitted, decode_s


def run(seconds: float = 10.0, seed: int = 0, codec_dir: str | None = None) -> dict:
    from gpu_worker.codec import SnacCodec, set_cpu_threads
    from gpu_worker.stand_in import build_snac

    threads = set_cpu_threads()
    if codec_dir is None:
        codec_dir = str(Path(tempfile.gettempdir()) / "voicering-bench-snac")
        if not (Path(codec_dir) / "pytorch_model.bin").exists():
            build_snac(Path(codec_dir), seed=seed)
    codec = SnacCodec.load(codec_dir, device="cpu")
    n = max(REFERENCE_WINDOW + 1, round(seconds * SAMPLE_RATE / SAMPLES_PER_FRAME))
    frames = _random_frames(n, seed)
    codec.decode_frames(frames[:4])  # warm-up

    offline = codec.decode_frames(frames)
    ours, ours_s, first_tokens = _ours(codec, frames)
    ref, ref_frames, ref_s = _reference(codec, frames)
    ref_offline = np.concatenate([offline[f * SAMPLES_PER_FRAME:(f + 1) * SAMPLES_PER_FRAME] for f in ref_frames])

    ours_audio_s = len(ours) / SAMPLE_RATE
    ref_audio_s = len(ref) / SAMPLE_RATE
    ours_rate = ours_s / ours_audio_s
    ref_rate = ref_s / ref_audio_s
    return {
        "frames_in": n,
        "frames_out": len(ours) / SAMPLES_PER_FRAME,
        "tokens_before_first_audio": first_tokens,
        "snr_db_vs_offline": _snr_db(ours, offline),
        "decode_s_per_audio_s": round(ours_rate, 4),
        "reference_tokens_before_first_audio": REFERENCE_WINDOW * FRAME_TOKENS,
        "reference_frames_out": len(ref) / SAMPLES_PER_FRAME,
        "reference_snr_db_vs_offline": _snr_db(ref, ref_offline),
        "reference_decode_s_per_audio_s": round(ref_rate, 4),
        "decode_work_ratio": round(ours_rate / ref_rate, 4),
        "torch_threads": threads,
        "audio_s": round(n * SAMPLES_PER_FRAME / SAMPLE_RATE, 3),
    }
