"""`first_audio_frames` (issue 38 item 3): the setting reaches every stream's schedule, and a real
`voicering worker --first-audio-frames 1` speaks its first frame decoded from that frame alone,
i.e. as soon as its 7 tokens exist (the decoder-level checks are in test_codec.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_worker.client import WorkerClient
from gpu_worker.codec import ChunkSchedule
from gpu_worker.orpheus import SAMPLES_PER_FRAME
from gpu_worker.protocol import ContextOptions
from gpu_worker.scheduler import make_decode_runner, planner_window_lengths
from gpu_worker.settings import WorkerSettings
from gpu_worker.worker import chunk_schedule
from tests.fixtures.models import start_worker

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


@pytest.fixture(scope="module")
def one_frame_worker(stand_in, adapter_store, tmp_path_factory):
    handle = start_worker(stand_in, adapter_store, tmp_path_factory.mktemp("first-audio") / "worker.log",
                          "--first-audio-frames", "1", "--max-loras", "2")
    yield handle
    handle.stop()


async def test_a_worker_set_to_one_frame_speaks_its_first_frame_decoded_alone(one_frame_worker):
    """Same seed, same text: the first frame of a 6-frame utterance is, byte for byte, the whole of
    a 1-frame utterance (frame 0 with no right context). Under the default schedule it is not: it
    waits for frame 1 and is decoded with it."""
    quiet = dict(seed=21, trim_silence=False)
    async with await WorkerClient.connect(one_frame_worker.url) as client:
        alone = await client.say("tara", "Hello there.", options=ContextOptions(max_tokens=7 * 1 + 1, **quiet))
        longer = await client.say("tara", "Hello there.", options=ContextOptions(max_tokens=7 * 6 + 1, **quiet))
    assert (alone.done.stats.frames, longer.done.stats.frames) == (1, 6)
    assert len(alone.pcm) == FRAME_BYTES and len(longer.pcm) == 6 * FRAME_BYTES  # every frame, once
    assert longer.pcm[:FRAME_BYTES] == alone.pcm
