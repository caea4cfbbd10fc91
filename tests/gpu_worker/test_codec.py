"""Streaming SNAC decoder: planning rules, and streamed audio == offline decode (random SNAC weights)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.codec import ChunkPlanner, ChunkSchedule, StreamingDecoder
from gpu_worker.orpheus import SAMPLES_PER_FRAME, Frame, FrameAssembler, frames_to_ids


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


def windows(schedule: ChunkSchedule, total: int) -> list:
    """Every window the planner gives as frames arrive one by one, then the flush."""
    planner, out = ChunkPlanner(schedule), []
    for available in range(1, total + 1):
        while (w := planner.next_window(available)) is not None:
            out.append(w)
    if (w := planner.final_window(total)) is not None:
        out.append(w)
    return out


def test_first_audio_after_one_frame_then_the_same_windows_as_today():
    one, today = ChunkSchedule.first_audio_after(1), ChunkSchedule()
    assert (one.tokens_before_first_audio(), today.tokens_before_first_audio()) == (7, 14)
    assert ChunkSchedule.first_audio_after(2) == today
    planner = ChunkPlanner(one)
    first = planner.next_window(1)
    assert (first.start, first.emit_start, first.emit_end, first.end) == (0, 0, 1, 1)  # no right context
    for total in (1, 2, 3, 4, 5, 9, 80):
        ours, theirs = windows(one, total), windows(today, total)
        assert ours[1:] == theirs[1:] and ours[0].emit_end == theirs[0].emit_end == 1


@pytest.mark.parametrize("frames", [0, 4])
def test_first_audio_frames_out_of_range_are_refused(frames):
    with pytest.raises(ValueError, match="choose 1 to 3"):
        ChunkSchedule.first_audio_after(frames)


def stream_ids(codec, ids: list[int], schedule: ChunkSchedule) -> tuple[list[np.ndarray], int | None]:
    """The serving path's order: ids -> FrameAssembler -> StreamingDecoder; ids consumed at first audio."""
    assembler, decoder = FrameAssembler(), StreamingDecoder(codec, schedule, noise_offset=3)
    chunks, first_at = [], None
    for i, token_id in enumerate(ids, start=1):
        if (frame := assembler.push(token_id)) is not None and (chunk := decoder.push(frame)) is not None:
            chunks.append(chunk)
            first_at = first_at or i
    if (tail := decoder.flush()) is not None:
        chunks.append(tail)
    return chunks, first_at


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 7, 12, 41])
def test_both_schedules_keep_every_frame_and_differ_only_in_the_first(codec, total):
    frames = random_frames(total, seed=total)
    ids = frames_to_ids(frames)
    one, one_at = stream_ids(codec, ids, ChunkSchedule.first_audio_after(1))
    two, two_at = stream_ids(codec, ids, ChunkSchedule())
    for chunks in (one, two):
        assert all(len(c) > 0 and len(c) % SAMPLES_PER_FRAME == 0 for c in chunks)
        assert sum(len(c) for c in chunks) == total * SAMPLES_PER_FRAME  # none lost, none twice
    assert one_at == 7  # the first frame's 7 tokens, then audio
    assert two_at == (14 if total >= 2 else None)  # a one-frame utterance speaks at its flush
    np.testing.assert_array_equal(np.concatenate(one)[SAMPLES_PER_FRAME:], np.concatenate(two)[SAMPLES_PER_FRAME:])
    offline = codec.decode_frames(frames, latent_offset=4 * 3)
    if total >= 2:  # frame 0 decoded alone is another decode of it, not a copy of today's
        assert snr_db(one[0][:SAMPLES_PER_FRAME], offline[:SAMPLES_PER_FRAME]) < snr_db(two[0][:SAMPLES_PER_FRAME], offline[:SAMPLES_PER_FRAME])


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
