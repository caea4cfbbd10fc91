"""Streaming SNAC decoder: planning rules, and streamed audio == offline decode (random SNAC weights)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.codec import ChunkPlanner, ChunkSchedule, StreamingDecoder
from gpu_worker.orpheus import SAMPLES_PER_FRAME, Frame


def random_frames(n: int, seed: int = 0) -> list[Frame]:
    rng = np.random.default_rng(seed)
    return [Frame(int(rng.integers(4096)), tuple(int(x) for x in rng.integers(4096, size=2)),
                  tuple(int(x) for x in rng.integers(4096, size=4))) for _ in range(n)]


def snr_db(test: np.ndarray, ref: np.ndarray) -> float:
    return float(10 * np.log10((ref**2).sum() / max(((test - ref) ** 2).sum(), 1e-20)))


@given(st.integers(min_value=0, max_value=200), st.integers(1, 4), st.integers(0, 3), st.integers(0, 4))
@settings(max_examples=200, deadline=None)
def test_planner_emits_every_frame_once_in_order(total, first_frames, first_right, right):
    schedule = ChunkSchedule(first_frames=first_frames, first_right=first_right, right=right)
    planner = ChunkPlanner(schedule)
    emitted = []
    for available in range(1, total + 1):
        while (w := planner.next_window(available)) is not None:
            assert w.start <= w.emit_start < w.emit_end <= w.end <= available
            assert w.emit_start - w.start <= schedule.left
            emitted.extend(range(w.emit_start, w.emit_end))
    if (w := planner.final_window(total)) is not None:
        emitted.extend(range(w.emit_start, w.emit_end))
    assert emitted == list(range(total))


def test_first_audio_after_two_frames_and_chunks_grow():
    planner = ChunkPlanner()
    assert planner.next_window(1) is None
    first = planner.next_window(2)
    assert first is not None and first.emitted_frames == 1
    assert ChunkSchedule().tokens_before_first_audio() == 14
    sizes = []
    for available in range(3, 80):
        while (w := planner.next_window(available)) is not None:
            sizes.append(w.emitted_frames)
    assert sizes == sorted(sizes) and sizes[-1] == ChunkSchedule().max_frames


def test_decode_is_deterministic_and_exact_length(codec):
    frames = random_frames(5)
    a = codec.decode_frames(frames)
    b = codec.decode_frames(frames)
    assert a.shape == (5 * SAMPLES_PER_FRAME,)
    np.testing.assert_array_equal(a, b)


def test_streamed_decode_matches_offline(codec):
    frames = random_frames(40, seed=1)
    offline = codec.decode_frames(frames, latent_offset=4 * 7)
    decoder = StreamingDecoder(codec, noise_offset=7)
    chunks = [c for f in frames if (c := decoder.push(f)) is not None]
    chunks.append(decoder.flush())
    streamed = np.concatenate(chunks)
    assert len(streamed) == len(frames) * SAMPLES_PER_FRAME  # nothing lost, exactly 2048 per frame
    assert all(len(c) % SAMPLES_PER_FRAME == 0 for c in chunks)
    assert snr_db(streamed, offline) >= 45.0
    # after the first chunk (1 frame of right context) the windows carry full context: near-exact
    tail = slice(4 * SAMPLES_PER_FRAME, None)
    assert snr_db(streamed[tail], offline[tail]) >= 70.0


def test_noise_offset_changes_noise_not_length(codec):
    frames = random_frames(3, seed=2)
    a, b = codec.decode_frames(frames, 0), codec.decode_frames(frames, 400)
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_encode_then_decode_shapes(codec):
    audio = np.sin(np.linspace(0, 2000, 3 * SAMPLES_PER_FRAME + 100)).astype(np.float32) * 0.3
    frames = codec.encode(audio)
    assert len(frames) == 4  # padded to whole frames
    assert all(0 <= c < 4096 for f in frames for c in f.slot_codes())
    batch = codec.encode_batch([audio, audio[: SAMPLES_PER_FRAME]])
    assert [len(b) for b in batch] == [4, 1]
    assert batch[0] == frames


def test_decode_batch_rejects_ragged_windows(codec):
    with pytest.raises(ValueError):
        codec.decode_batch([random_frames(2), random_frames(3)], [0, 0])
