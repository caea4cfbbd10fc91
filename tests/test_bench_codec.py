"""bench/codec.py: the reference Orpheus decoder loop re-run over a token stream (when it first
speaks, which frames it emits, what a dropped code 0 does to it), against a codec that decodes
each frame to a constant so emitted frames can be read back from the audio."""

from __future__ import annotations

import numpy as np

from bench.codec import ours_stream, reference_stream
from gpu_worker.orpheus import SAMPLES_PER_FRAME, Frame, frames_to_ids


class FrameIdCodec:
    """decode_frames -> each frame's samples equal its level-0 code."""

    def decode_frames(self, frames, latent_offset: int = 0) -> np.ndarray:
        return np.repeat(np.array([f.c0 for f in frames], np.float32), SAMPLES_PER_FRAME)


def _frames(n: int) -> list[Frame]:
    return [Frame(100 + i, (1, 2), (3, 4, 5, 6)) for i in range(n)]  # no code 0 anywhere


def _emitted(audio: np.ndarray) -> list[int]:
    return [int(v) - 100 for v in audio[::SAMPLES_PER_FRAME]]


def test_reference_speaks_after_28_tokens_and_never_emits_the_first_or_last_two_frames():
    ref = reference_stream(FrameIdCodec(), frames_to_ids(_frames(10)))
    assert ref.first_audio_after == 28
    assert _emitted(ref.audio) == list(range(1, 8)) == ref.frames
    assert ref.dropped == 0 and ref.skipped_windows == 0


def test_ours_speaks_after_14_tokens_and_emits_every_frame():
    ours = ours_stream(FrameIdCodec(), frames_to_ids(_frames(10)))
    assert ours.first_audio_after == 14
    assert _emitted(ours.audio) == list(range(10))


def test_ours_set_to_one_frame_speaks_after_7_tokens_and_emits_every_frame():
    from gpu_worker.codec import ChunkSchedule

    ours = ours_stream(FrameIdCodec(), frames_to_ids(_frames(10)), ChunkSchedule.first_audio_after(1))
    assert ours.first_audio_after == 7
    assert _emitted(ours.audio) == list(range(10))


def test_an_utterance_shorter_than_the_first_chunk_speaks_at_its_end():
    ours = ours_stream(FrameIdCodec(), frames_to_ids(_frames(1)))
    assert ours.first_audio_after == 7 and _emitted(ours.audio) == [0]


def test_a_code_zero_shifts_the_reference_slots_and_costs_it_audio():
    frames = _frames(10)
    frames[1] = Frame(101, (1, 2), (0, 4, 5, 6))  # slot 2 of frame 1 carries code 0
    ref = reference_stream(FrameIdCodec(), frames_to_ids(frames))
    clean = reference_stream(FrameIdCodec(), frames_to_ids(_frames(10)))
    assert ref.dropped >= 1
    assert len(ref.audio) < len(clean.audio)  # later windows read codes from the wrong slot and are refused
    assert ref.first_audio_after is None or ref.first_audio_after > 28
