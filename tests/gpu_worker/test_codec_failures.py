"""Every stream awaiting the codec gets its audio or an error, whatever happens to the runner: a
batcher that dies of a bug, `aclose` while windows are queued or being decoded. Before, these
left their waiters hanging forever (a context that never ends)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gpu_worker.codec import Window
from gpu_worker.errors import EngineError
from gpu_worker.orpheus import Frame
from gpu_worker.scheduler import BatchedDecodeRunner, DecodeRunner

FRAMES = [Frame(i, (i, i), (i, i, i, i)) for i in range(4)]
WINDOW = Window(0, 0, 4, 4)


def slowed(decode, seconds: float):
    def slow(*args):
        time.sleep(seconds)
        return decode(*args)
    return slow


async def test_a_batcher_that_dies_fails_its_windows_and_the_next_window_restarts_it(codec, caplog):
    runner = BatchedDecodeRunner(codec, tick_s=0.01)
    real_groups = runner._groups
    runner._groups = lambda jobs: 1 / 0  # a bug outside the per-group guard
    try:
        results = await asyncio.wait_for(asyncio.gather(*(runner.decode(FRAMES, WINDOW, i) for i in range(3)),
                                                        return_exceptions=True), 10)
        assert all(isinstance(r, EngineError) and r.retryable for r in results)
        assert "codec batcher died" in caplog.text
        runner._groups = real_groups
        audio = await asyncio.wait_for(runner.decode(FRAMES, WINDOW, 0), 30)
        assert isinstance(audio, np.ndarray) and len(audio) == 4 * 2048
    finally:
        await runner.aclose()


async def test_batched_aclose_during_a_decode_fails_every_waiter(codec):
    runner = BatchedDecodeRunner(codec, tick_s=0.01)
    runner._decode = slowed(runner._decode, 0.5)
    waiters = [asyncio.create_task(runner.decode(FRAMES, WINDOW, i)) for i in range(3)]
    await asyncio.sleep(0.1)  # the batcher is inside the (slow) decode now
    late = asyncio.create_task(runner.decode(FRAMES, WINDOW, 9))  # queued behind it
    await asyncio.sleep(0)
    await runner.aclose()
    results = await asyncio.wait_for(asyncio.gather(*waiters, late, return_exceptions=True), 10)
    assert all(isinstance(r, EngineError) for r in results), results
    with pytest.raises(EngineError, match="shutting down"):
        await runner.decode(FRAMES, WINDOW, 0)


async def test_sequential_aclose_answers_queued_windows_with_an_error(codec):
    runner = DecodeRunner(codec)
    runner._decode_one = slowed(runner._decode_one, 0.3)
    waiters = [asyncio.create_task(runner.decode(FRAMES, WINDOW, i)) for i in range(3)]
    await asyncio.sleep(0.05)
    await runner.aclose()
    results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
    assert isinstance(results[0], np.ndarray)  # the one being decoded finishes
    assert all(isinstance(r, EngineError) for r in results[1:]), results  # an error, not a silent cancel
