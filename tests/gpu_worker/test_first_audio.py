"""`first_audio_frames` (issue 38 item 3): the worker's setting reaches every stream's schedule, a
start's `options.first_audio_frames` chooses for its own context, and a context set to 1 on the real
session worker (`voicering worker`, whose own setting is the default, 2) speaks its first frame
decoded from that frame alone, i.e. as soon as its 7 tokens exist (the decoder-level checks are in
test_codec.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_worker.client import WorkerClient
from gpu_worker.codec import ChunkSchedule
from gpu_worker.orpheus import SAMPLES_PER_FRAME
from gpu_worker.errors import BadRequest
from gpu_worker.protocol import FIRST_AUDIO_FRAMES_MAX, ContextOptions, Start, encode, parse_client
from gpu_worker.scheduler import make_decode_runner, planner_window_lengths, warm_window_lengths
from gpu_worker.settings import WorkerSettings
from gpu_worker.worker import chunk_schedule

FRAME_BYTES = SAMPLES_PER_FRAME * 2  # PCM16


async def test_the_setting_reaches_the_runner_every_stream_plans_by(monkeypatch, codec):
    assert chunk_schedule(WorkerSettings(model="org/weights")) == ChunkSchedule()  # unset: the codec's default
    monkeypatch.setenv("VOICERING_WORKER_FIRST_AUDIO_FRAMES", "1")
    schedule = chunk_schedule(WorkerSettings(model="org/weights"))
    assert schedule.tokens_before_first_audio() == 7
    runner = make_decode_runner(codec, "batched", schedule=schedule)
    try:
        assert runner.schedule == schedule
    finally:
        await runner.aclose()
    assert planner_window_lengths(schedule) == [1, 4, 6, 8, 12]  # what a CUDA worker warms: the first window is 1 frame


@pytest.mark.parametrize("frames", [0, 4])
def test_out_of_range_values_are_refused_at_start(frames):
    with pytest.raises(ValidationError, match="first_audio_frames"):
        WorkerSettings(model="org/weights", first_audio_frames=frames)


def test_a_start_may_choose_1_to_3_and_unset_stays_off_the_wire():
    assert [ChunkSchedule.first_audio_after(n).first_audio_frames for n in range(1, FIRST_AUDIO_FRAMES_MAX + 1)] \
        == [1, 2, 3]  # the protocol's bound is the codec's
    with pytest.raises(ValueError):
        ChunkSchedule.first_audio_after(FIRST_AUDIO_FRAMES_MAX + 1)
    assert "first_audio_frames" not in encode(Start("c", "tara", "Hi."))  # older workers accept the start
    chosen = parse_client(encode(Start("c", "tara", "Hi.", options=ContextOptions(first_audio_frames=1))))
    assert chosen.options.first_audio_frames == 1
    for bad in (0, 4, 1.5, True, "1"):
        with pytest.raises(BadRequest, match="first_audio_frames"):
            parse_client(encode(Start("c", "tara", "Hi.", options=ContextOptions(first_audio_frames=bad))))


def test_a_cuda_worker_warms_the_windows_of_every_choice():
    assert warm_window_lengths() == [1, 2, 3, 4, 6, 8, 12]
    assert warm_window_lengths(ChunkSchedule.first_audio_after(1)) == warm_window_lengths()


async def test_a_context_set_to_one_frame_speaks_its_first_frame_decoded_alone(worker):
    """Same seed, same text: the first frame of a 6-frame utterance is, byte for byte, the whole of
    a 1-frame utterance (frame 0 with no right context) when the context asks for one frame. Under
    the worker's default schedule it is not: it waits for frame 1 and is decoded with it."""
    quiet = dict(seed=21, trim_silence=False)
    spoken = {}
    async with await WorkerClient.connect(worker.url) as client:
        for frames in (1, None):
            alone = await client.say("tara", "Hello there.", options=ContextOptions(
                max_tokens=7 * 1 + 1, first_audio_frames=frames, **quiet))
            longer = await client.say("tara", "Hello there.", options=ContextOptions(
                max_tokens=7 * 6 + 1, first_audio_frames=frames, **quiet))
            assert (alone.done.stats.frames, longer.done.stats.frames) == (1, 6)
            assert len(alone.pcm) == FRAME_BYTES and len(longer.pcm) == 6 * FRAME_BYTES  # every frame, once
            spoken[frames] = alone.pcm, longer.pcm
    alone, longer = spoken[1]
    assert longer[:FRAME_BYTES] == alone
    default_alone, default_longer = spoken[None]
    assert default_alone == alone  # a lone frame is decoded alone either way (the final flush)
    assert default_longer[:FRAME_BYTES] != alone  # the default decodes frame 0 with frame 1 beside it
    assert default_longer[FRAME_BYTES:] == longer[FRAME_BYTES:]  # later chunks: the same windows
