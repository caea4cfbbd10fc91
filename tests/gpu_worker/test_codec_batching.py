"""Cross-stream codec batching (forced on CPU): windows gathered from several live streams and
decoded together give the same audio as decoding them one by one; the policy follows the device."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gpu_worker.codec import ChunkPlanner
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.orpheus import SAMPLES_PER_FRAME, Frame
from gpu_worker.scheduler import (
    BatchedDecodeRunner,
    DecodeRunner,
    bucket_size,
    make_decode_runner,
    planner_window_lengths,
    resolve_policy,
)


def random_frames(n: int, seed: int) -> list[Frame]:
    rng = np.random.default_rng(seed)
    return [Frame(int(rng.integers(4096)), tuple(int(x) for x in rng.integers(4096, size=2)),
                  tuple(int(x) for x in rng.integers(4096, size=4))) for _ in range(n)]


async def stream_audio(runner, frames: list[Frame], noise_offset: int, arrival_s: float) -> np.ndarray:
    """One stream as speech.py drives it: frames arrive over time, windows are awaited in order."""
    planner, have, chunks = ChunkPlanner(), [], []
    for frame in frames:
        await asyncio.sleep(arrival_s)
        have.append(frame)
        while (window := planner.next_window(len(have))) is not None:
            chunks.append(await runner.decode(have, window, noise_offset))
    if (window := planner.final_window(len(have))) is not None:
        chunks.append(await runner.decode(have, window, noise_offset))
    return np.concatenate(chunks)


async def test_batched_audio_equals_sequential_audio(codec):
    streams = [(random_frames(n, seed), 37 * seed) for seed, n in enumerate((14, 14, 14, 9))]
    sequential = DecodeRunner(codec)
    metrics = WorkerMetrics()
    batched = BatchedDecodeRunner(codec, tick_s=0.05, metrics=metrics)
    try:
        expected = [await stream_audio(sequential, frames, offset, 0.0) for frames, offset in streams]
        got = await asyncio.gather(*(stream_audio(batched, frames, offset, 0.001) for frames, offset in streams))
    finally:
        await sequential.aclose()
        await batched.aclose()
    for (frames, _), want, have in zip(streams, expected, got, strict=True):
        assert len(have) == len(frames) * SAMPLES_PER_FRAME
        np.testing.assert_allclose(have, want, rtol=0, atol=1e-5)  # float rounding only: same math, same lengths
    sizes = metrics.codec_batch_size.collect()[0].samples
    count = next(s.value for s in sizes if s.name.endswith("_count"))
    total = next(s.value for s in sizes if s.name.endswith("_sum"))
    assert total / count > 1.5  # windows really were decoded together


async def test_a_cancelled_waiter_does_not_break_the_batcher(codec):
    runner = BatchedDecodeRunner(codec, tick_s=0.05)
    frames = random_frames(4, 1)
    planner = ChunkPlanner()
    window = planner.next_window(4)
    try:
        doomed = asyncio.create_task(runner.decode(frames, window, 0))
        await asyncio.sleep(0.01)
        doomed.cancel()
        audio = await runner.decode(frames, window, 0)
        assert len(audio) == window.emitted_frames * SAMPLES_PER_FRAME
    finally:
        await runner.aclose()


async def test_policy_by_device_and_override(codec):
    assert resolve_policy("auto", "cpu") == "sequential" and resolve_policy("auto", "cuda:0") == "batched"
    auto, forced = make_decode_runner(codec, "auto"), make_decode_runner(codec, "batched")
    assert isinstance(auto, DecodeRunner) and isinstance(forced, BatchedDecodeRunner)
    await auto.aclose()
    await forced.aclose()
    assert planner_window_lengths() == [2, 4, 6, 8, 12]


@pytest.mark.parametrize(("n", "bucket"), [(1, 1), (3, 4), (8, 8), (9, 16), (64, 64), (70, 70)])
def test_batch_sizes_round_up_to_buckets(n, bucket):
    assert bucket_size(n) == bucket
