"""Streaming SNAC decode: voicering's windowed decoder vs the reference Orpheus strategy, same model,
same token stream, same run.

Both sides consume the same stream of generated token ids (random codes laid out as Orpheus
generates them) one id at a time. Ours: `FrameAssembler` -> `StreamingDecoder`. The reference:
orpheus-speech's own decoder loop, re-run here over the ids (`reference_stream`): it turns each id
into a code assuming slot ``count % 7`` (``count`` = codes accepted so far), drops a code of 0, and
once ``count`` is a multiple of 7 above 27 decodes the last 28 codes (4 frames) and keeps samples
[2048:4096] (the window's second frame); a window holding a code outside 0..4096 is skipped. So
its tokens-before-first-audio, frames out and SNR are what that loop does, not constants. Both use
our position-indexed noise, so the reference's SNR here is its best case (the real one also draws
fresh noise per call), and it gets one id per text delta (its best case too: it parses only the
last token of a delta).

Decode speed: a warm-up pass of both sides over the first seconds, then ``rounds`` rounds, each
timing ours and the reference back to back (which goes first alternates); seconds of decode per
second of audio and their ratio are reported as min / median / max over the rounds, the targets
judged on the median.

First audio (`first_audio`): our decoder under each schedule of ``FIRST_AUDIO_FRAMES`` (first
audio after 1 frame, no right context, or 2 frames, one frame of right context) over the same
utterances (the bench's length and shorter ones, a seed each): tokens before first audio, SNR of
the first chunk (its one frame, the first 85 ms) and of the whole utterance against the offline
decode, frames out == frames in, and whether the audio after the first frame is the default
schedule's sample for sample. ``chosen_frames`` applies issue 38's rule: the fewest frames whose
every utterance keeps ``FIRST_AUDIO_MIN_SNR_DB`` and every frame.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpu_worker.orpheus import AUDIO_BASE, CODEBOOK_SIZE, FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME, Frame, frames_to_ids

if TYPE_CHECKING:
    from gpu_worker.codec import ChunkSchedule

REFERENCE_WINDOW = 4  # frames per reference decode (28 codes)
WARM_SECONDS = 3.0
FIRST_AUDIO_FRAMES = (1, 2)  # schedules compared: first audio after 7 and 14 tokens
UTTERANCE_SHARES = (1.0, 0.5, 0.25, 0.125)  # first-audio utterances, as shares of the bench's length
FIRST_AUDIO_MIN_SNR_DB = 45.0  # whole-utterance SNR a schedule must keep to be the default
TARGETS = {  # figure: (comparison, bound)
    "tokens_before_first_audio": ("<=", 14),
    "frames_out_equals_frames_in": ("==", True),
    "snr_db_vs_offline": (">=", 45.0),
    "decode_work_ratio": ("<=", 0.5),
}


def _random_frames(n: int, seed: int) -> list[Frame]:
    rng = np.random.default_rng(seed)
    return [Frame(int(rng.integers(4096)), tuple(int(x) for x in rng.integers(4096, size=2)),
                  tuple(int(x) for x in rng.integers(4096, size=4))) for _ in range(n)]


def _snr_db(test: np.ndarray, ref: np.ndarray) -> float:
    return round(float(10 * np.log10((ref**2).sum() / max(((test - ref) ** 2).sum(), 1e-20))), 2)


@dataclass
class Streamed:
    """What one side made of a token stream."""

    audio: np.ndarray
    decode_s: float
    first_audio_after: int | None  # ids consumed when the first audio came out
    frames: list[int] = field(default_factory=list)  # reference only: stream frame index of each chunk
    dropped: int = 0  # reference only: ids it discarded (code 0, unparsable)
    skipped_windows: int = 0  # reference only: windows refused by its range check


def ours_stream(codec, ids: list[int], schedule: ChunkSchedule | None = None) -> Streamed:
    """Our decoder over the ids, under ``schedule`` (a `ChunkSchedule`; default: the codec's)."""
    from gpu_worker.codec import StreamingDecoder
    from gpu_worker.orpheus import FrameAssembler

    assembler, decoder = FrameAssembler(), StreamingDecoder(codec, schedule)
    chunks, first_at, decode_s = [], None, 0.0
    for i, token_id in enumerate(ids):
        frame = assembler.push(token_id)
        if frame is None:
            continue
        t = time.perf_counter()
        chunk = decoder.push(frame)
        decode_s += time.perf_counter() - t
        if chunk is not None:
            chunks.append(chunk)
            first_at = first_at if first_at is not None else i + 1
    t = time.perf_counter()
    tail = decoder.flush()
    decode_s += time.perf_counter() - t
    if tail is not None:
        chunks.append(tail)
        first_at = first_at if first_at is not None else len(ids)  # an utterance shorter than the first chunk
    return Streamed(np.concatenate(chunks), decode_s, first_at)


def reference_stream(codec, ids: list[int]) -> Streamed:
    """orpheus-speech's `tokens_decoder` + `turn_token_into_id` + `convert_to_audio`, over vocabulary
    ids instead of their text (``<custom_token_N>`` with N = id - 128256)."""
    buffer: list[int] = []  # accepted codes
    where: list[int] = []  # stream position of each accepted code
    count, dropped, skipped, decode_s, first_at = 0, 0, 0, 0.0, None
    chunks, frames = [], []
    for i, token_id in enumerate(ids):
        code = token_id - AUDIO_BASE - (count % FRAME_TOKENS) * CODEBOOK_SIZE  # its slot assumption
        if code <= 0:  # `if token > 0`: code 0 (and anything below) is dropped, count does not advance
            dropped += 1
            continue
        buffer.append(code)
        where.append(i)
        count += 1
        if count % FRAME_TOKENS == 0 and count > 27:
            window = buffer[-REFERENCE_WINDOW * FRAME_TOKENS:]
            if any(c < 0 or c > CODEBOOK_SIZE for c in window):  # its check: 4096 passes
                skipped += 1
                continue
            start = where[-REFERENCE_WINDOW * FRAME_TOKENS] // FRAME_TOKENS  # stream frame of the window start
            frames_in = [Frame.from_slot_codes(window[k:k + FRAME_TOKENS]) for k in range(0, len(window), FRAME_TOKENS)]
            t = time.perf_counter()
            try:
                audio = codec.decode_frames(frames_in, latent_offset=start * 4)
            except (IndexError, RuntimeError):  # code 4096 is past SNAC's codebook: the reference fails here
                skipped += 1
                continue
            finally:
                decode_s += time.perf_counter() - t
            chunks.append(audio[SAMPLES_PER_FRAME:2 * SAMPLES_PER_FRAME])
            frames.append(where[-(REFERENCE_WINDOW - 1) * FRAME_TOKENS] // FRAME_TOKENS)  # the kept (second) frame
            first_at = first_at if first_at is not None else i + 1
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return Streamed(audio, decode_s, first_at, frames, dropped, skipped)


def _spread(values: list[float], digits: int = 4) -> dict[str, float]:
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits),
            "max": round(max(values), digits)}


def _meets(value, op: str, bound) -> bool:
    return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]


def first_audio(codec, seconds: float, seed: int) -> dict:
    """Each schedule of FIRST_AUDIO_FRAMES (and the default) over the same utterances; see the module doc."""
    from gpu_worker.codec import ChunkSchedule

    default = ChunkSchedule().first_audio_frames
    schedules = sorted({*FIRST_AUDIO_FRAMES, default})
    full = seconds * SAMPLE_RATE / SAMPLES_PER_FRAME
    lengths = list(dict.fromkeys(max(schedules[-1], round(share * full)) for share in UTTERANCE_SHARES))
    seen = {f: {"tokens": [], "first": [], "whole": [], "kept": True, "later_equal": True} for f in schedules}
    for k, n in enumerate(lengths):
        frames = _random_frames(n, seed + k)
        ids = frames_to_ids(frames)
        offline = codec.decode_frames(frames)
        audio = {f: ours_stream(codec, ids, ChunkSchedule.first_audio_after(f)) for f in schedules}
        later = audio[default].audio[SAMPLES_PER_FRAME:]  # the default's audio after the first frame
        for f, streamed in audio.items():
            seen[f]["tokens"].append(streamed.first_audio_after)
            seen[f]["first"].append(_snr_db(streamed.audio[:SAMPLES_PER_FRAME], offline[:SAMPLES_PER_FRAME]))
            seen[f]["whole"].append(_snr_db(streamed.audio, offline))
            seen[f]["kept"] &= len(streamed.audio) == n * SAMPLES_PER_FRAME
            seen[f]["later_equal"] &= np.array_equal(streamed.audio[SAMPLES_PER_FRAME:], later)
    rows = [{"first_audio_frames": f, "tokens_before_first_audio": max(v["tokens"]),
             "first_chunk_snr_db": v["first"], "snr_db_vs_offline": v["whole"],
             "frames_out_equals_frames_in": v["kept"], "later_audio_equals_default": v["later_equal"],
             "meets_rule": v["kept"] and min(v["whole"]) >= FIRST_AUDIO_MIN_SNR_DB} for f, v in seen.items()]
    return {"utterance_frames": lengths, "default_frames": default, "min_snr_db": FIRST_AUDIO_MIN_SNR_DB,
            "chosen_frames": next((r["first_audio_frames"] for r in rows if r["meets_rule"]), None), "schedules": rows}


def run(seconds: float = 10.0, seed: int = 0, codec_dir: str | None = None, rounds: int = 3) -> dict:
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
    ids = frames_to_ids(frames)
    offline = codec.decode_frames(frames)

    warm = ids[:FRAME_TOKENS * max(REFERENCE_WINDOW + 1, round(WARM_SECONDS * SAMPLE_RATE / SAMPLES_PER_FRAME))]
    ours_stream(codec, warm)
    reference_stream(codec, warm)
    ours_rate, ref_rate, ratio = [], [], []
    for r in range(rounds):
        sides = [ours_stream, reference_stream] if r % 2 == 0 else [reference_stream, ours_stream]
        result = {side: side(codec, ids) for side in sides}
        ours, ref = result[ours_stream], result[reference_stream]
        ours_rate.append(ours.decode_s / (len(ours.audio) / SAMPLE_RATE))
        ref_rate.append(ref.decode_s / max(len(ref.audio) / SAMPLE_RATE, 1e-9))
        ratio.append(ours_rate[-1] / ref_rate[-1])

    ref_offline = np.concatenate([offline[f * SAMPLES_PER_FRAME:(f + 1) * SAMPLES_PER_FRAME] for f in ref.frames]) \
        if ref.frames else np.zeros(0, np.float32)
    figures = {
        "frames_in": n,
        "frames_out": len(ours.audio) / SAMPLES_PER_FRAME,
        "frames_out_equals_frames_in": len(ours.audio) == n * SAMPLES_PER_FRAME,
        "tokens_before_first_audio": ours.first_audio_after,
        "snr_db_vs_offline": _snr_db(ours.audio, offline),
        "first_chunk_snr_db": _snr_db(ours.audio[:SAMPLES_PER_FRAME], offline[:SAMPLES_PER_FRAME]),
        "first_audio": first_audio(codec, seconds, seed),
        "decode_s_per_audio_s": _spread(ours_rate),
        "reference_tokens_before_first_audio": ref.first_audio_after,
        "reference_frames_out": len(ref.audio) / SAMPLES_PER_FRAME,
        "reference_snr_db_vs_offline": _snr_db(ref.audio, ref_offline) if ref.frames else None,
        "reference_dropped_tokens": ref.dropped,
        "reference_skipped_windows": ref.skipped_windows,
        "reference_decode_s_per_audio_s": _spread(ref_rate),
        "decode_work_ratio_spread": _spread(ratio),
        "decode_work_ratio": round(statistics.median(ratio), 4),
        "rounds": rounds,
        "torch_threads": threads,
        "audio_s": round(n * SAMPLES_PER_FRAME / SAMPLE_RATE, 3),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    figures["targets_met"] = {name: _meets(figures[name], op, bound) for name, (op, bound) in TARGETS.items()}
    return figures
