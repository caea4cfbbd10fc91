"""Codec work off the event loop. `decode(frames, window, noise_offset)` is the one seam the serving
path awaits; two policies sit behind it:

- `DecodeRunner` ("sequential"): each window decoded on its own, in arrival order, on one codec
  thread. Measured fastest on CPU, where a batched SNAC call costs more than the calls it replaces.
- `BatchedDecodeRunner` ("batched"): windows from every live stream wait at most one tick
  (~15 ms), then all windows of equal length are decoded in one call, batch padded up to a bucket
  size so a compiled decoder sees a handful of shapes (warmed at start-up on CUDA). Windows are
  grouped by exact length rather than padded: SNAC is convolutional, so extra context or padding
  would change the samples; grouping keeps batched audio equal to sequential audio (up to float
  rounding). The streaming
  planner's windows come in few lengths (2, 4, 6, 8 then 12 frames in steady state, plus one
  final window per context; the first is 1 frame with first audio after one frame), so groups
  fill well once several streams are live.

`make_decode_runner` picks the policy by device ("auto": batched on CUDA, sequential on CPU). The
runner also carries the worker's `ChunkSchedule` (`runner.schedule`): `speech.py` plans every
stream's windows by it, and the batched runner warms exactly the window lengths it produces.

Every awaiting stream gets its audio or an error, whatever happens to the runner: a batcher task
that dies fails the windows it held (and the next window starts a new one), and `aclose` fails
whatever is queued or being decoded with a retryable `EngineError` instead of leaving it hanging.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpu_worker.codec import LATENT_PER_FRAME, ChunkSchedule, SnacCodec, Window, decode_window
from gpu_worker.errors import EngineError
from gpu_worker.orpheus import SAMPLES_PER_FRAME, Frame
from gpu_worker.protocol import FIRST_AUDIO_FRAMES_MAX

if TYPE_CHECKING:
    from gpu_worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

CodecPolicy = Literal["auto", "batched", "sequential"]
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TICK_S = 0.015  # longest a window waits for others to batch with
MAX_BATCH = 64  # windows per codec call


def _snapshot(frames: Sequence[Frame], window: Window) -> tuple[list[Frame], Window]:
    """Copy a window's frames (the stream's list keeps growing) and rebase the window on the copy."""
    snapshot = list(frames[window.start:window.end])
    return snapshot, Window(0, window.emit_start - window.start, window.emit_end - window.start, len(snapshot))


class DecodeRunner:
    """Decodes windows one by one on a dedicated thread (measured fastest on CPU)."""

    policy = "sequential"

    def __init__(self, codec: SnacCodec, metrics: WorkerMetrics | None = None,
                 schedule: ChunkSchedule | None = None) -> None:
        self.codec = codec
        self.schedule = schedule or ChunkSchedule()  # every stream's windows, planned in speech.py
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codec")
        self.pending = 0
        self._closed = False

    async def decode(self, frames: Sequence[Frame], window: Window, noise_offset: int) -> np.ndarray:
        if self._closed:
            raise _stopped()
        loop = asyncio.get_running_loop()
        snapshot, shifted = _snapshot(frames, window)
        self.pending += 1
        try:
            return await loop.run_in_executor(self._executor, self._decode_one, snapshot, shifted, noise_offset + window.start)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and not (task is not None and task.cancelling()):
                raise _stopped() from None  # our executor dropped the window at aclose, nobody cancelled us
            raise
        finally:
            self.pending -= 1

    def _decode_one(self, frames: list[Frame], window: Window, offset: int) -> np.ndarray:
        started = time.perf_counter()
        audio = decode_window(self.codec, frames, window, offset)
        if self._metrics is not None:
            self._metrics.codec_batch_size.observe(1)
            self._metrics.codec_seconds.observe(time.perf_counter() - started)
        return audio

    async def aclose(self) -> None:
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)


def _stopped() -> EngineError:
    return EngineError("the codec is shutting down; retry on another worker")


@dataclass(slots=True)
class _Job:
    frames: list[Frame]
    window: Window  # rebased on frames
    latent_offset: int
    future: asyncio.Future


def bucket_size(n: int, buckets: Sequence[int] = BATCH_BUCKETS) -> int:
    """Smallest bucket holding n windows (n itself past the largest bucket)."""
    return next((b for b in buckets if b >= n), n)


def decode_group(codec: SnacCodec, jobs: Sequence[_Job], padded: int) -> list[np.ndarray]:
    """Equal-length windows in one codec call, batch padded to ``padded`` rows by repeating the
    last window; returns each job's emitted samples."""
    rows = [job.frames for job in jobs] + [jobs[-1].frames] * (padded - len(jobs))
    offsets = [job.latent_offset for job in jobs] + [jobs[-1].latent_offset] * (padded - len(jobs))
    audio = codec.decode_batch(rows, offsets)  # padded x [len * 2048]
    return [a[job.window.emit_start * SAMPLES_PER_FRAME:job.window.emit_end * SAMPLES_PER_FRAME]
            for a, job in zip(audio, jobs, strict=False)]


class BatchedDecodeRunner:
    """Gathers windows from all live streams for up to one tick, decodes equal lengths together."""

    policy = "batched"

    def __init__(self, codec: SnacCodec, *, tick_s: float = TICK_S, max_batch: int = MAX_BATCH,
                 buckets: Sequence[int] = BATCH_BUCKETS, metrics: WorkerMetrics | None = None,
                 schedule: ChunkSchedule | None = None) -> None:
        self.codec = codec
        self.schedule = schedule or ChunkSchedule()  # every stream's windows, planned in speech.py
        self.tick_s = tick_s
        self.max_batch = max_batch
        self.buckets = tuple(b for b in buckets if b <= max_batch) or (max_batch,)
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codec")
        self._jobs: list[_Job] = []  # queued for the next tick
        self._inflight: list[_Job] = []  # taken by the batcher, not yet answered
        self._first_at = 0.0
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._closed = False
        self._stream = None  # a CUDA stream of its own, so decodes overlap the engine's kernels

    @property
    def pending(self) -> int:
        return len(self._jobs) + len(self._inflight)

    async def decode(self, frames: Sequence[Frame], window: Window, noise_offset: int) -> np.ndarray:
        if self._closed:
            raise _stopped()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run(), name="codec-batcher")
            self._loop_task.add_done_callback(self._batcher_ended)
        snapshot, shifted = _snapshot(frames, window)
        future = asyncio.get_running_loop().create_future()
        if not self._jobs:
            self._first_at = time.perf_counter()
        self._jobs.append(_Job(snapshot, shifted, (noise_offset + window.start) * LATENT_PER_FRAME, future))
        self._wake.set()
        return await future

    def _batcher_ended(self, task: asyncio.Task) -> None:
        """Whatever ended the batcher (a bug, aclose), no waiter is left hanging."""
        if task.cancelled() or self._closed:
            error = _stopped()
        else:
            exc = task.exception()
            log.error("codec batcher died; failing its windows (the next window restarts it)", exc_info=exc)
            error = EngineError(f"codec batcher failed: {type(exc).__name__}")
        self._fail(self._inflight + self._jobs, error)
        self._inflight, self._jobs = [], []

    @staticmethod
    def _fail(jobs: list[_Job], error: Exception) -> None:
        for job in jobs:
            if job.future is not None and not job.future.done():
                job.future.set_exception(error)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            wait = self._first_at + self.tick_s - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            self._inflight = [job for job in self._jobs if not job.future.done()]
            self._jobs = []
            for group in self._groups(self._inflight):
                padded = bucket_size(len(group), self.buckets)
                started = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self._executor, self._decode, group, padded)
                except Exception as exc:  # a codec failure fails these windows, not the batcher
                    self._fail(group, EngineError(f"codec failed: {exc}"))
                    continue
                if self._metrics is not None:
                    self._metrics.codec_batch_size.observe(len(group))
                    self._metrics.codec_seconds.observe(time.perf_counter() - started)
                for job, audio in zip(group, results, strict=True):
                    if not job.future.done():
                        job.future.set_result(audio)
            self._inflight = []

    def _groups(self, jobs: list[_Job]) -> list[list[_Job]]:
        by_length: dict[int, list[_Job]] = {}
        for job in jobs:
            by_length.setdefault(len(job.frames), []).append(job)
        return [group[i:i + self.max_batch] for group in by_length.values() for i in range(0, len(group), self.max_batch)]

    def _decode(self, group: list[_Job], padded: int) -> list[np.ndarray]:
        if self._stream is None:
            return decode_group(self.codec, group, padded)
        import torch

        with torch.cuda.stream(self._stream):
            out = decode_group(self.codec, group, padded)
        self._stream.synchronize()
        return out

    def warm_up(self, lengths: Sequence[int], *, compile_decoder: bool) -> float:
        """Start-up on CUDA: optionally `torch.compile` the SNAC decoder, then decode every bucket
        size for every window length the planner produces, so no compile lands on live traffic."""
        import torch

        started = time.perf_counter()
        if self.codec.device.startswith("cuda"):
            self._stream = torch.cuda.Stream()
        if compile_decoder:
            self.codec.model.decoder = torch.compile(self.codec.model.decoder, dynamic=True)
        frame = Frame(0, (0, 0), (0, 0, 0, 0))
        for length in lengths:
            for size in self.buckets:
                dummy = _Job([frame] * length, Window(0, 0, length, length), 0, None)  # type: ignore[arg-type]
                self._decode([dummy], size)
        seconds = time.perf_counter() - started
        log.info("codec warmed for window lengths %s and batch sizes %s in %.1f s", list(lengths), list(self.buckets), seconds)
        return seconds

    async def aclose(self) -> None:
        self._closed = True
        if self._loop_task is not None and not self._loop_task.done():
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail(self._inflight + self._jobs, _stopped())
        self._inflight, self._jobs = [], []
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)


def planner_window_lengths(schedule: ChunkSchedule | None = None, horizon: int = 64) -> list[int]:
    """The window lengths (in frames) the streaming planner produces before the final flush."""
    from gpu_worker.codec import ChunkPlanner

    planner = ChunkPlanner(schedule or ChunkSchedule())
    lengths: set[int] = set()
    for available in range(1, horizon + 1):
        while (window := planner.next_window(available)) is not None:
            lengths.add(window.end - window.start)
    return sorted(lengths)


def warm_window_lengths(schedule: ChunkSchedule | None = None) -> list[int]:
    """Every window length a stream may need: the worker's schedule's and, since a start may choose
    its own first audio (`options.first_audio_frames`), those of every other choice too."""
    schedules = [schedule or ChunkSchedule()]
    schedules += [ChunkSchedule.first_audio_after(n) for n in range(1, FIRST_AUDIO_FRAMES_MAX + 1)]
    return sorted(set().union(*(planner_window_lengths(s) for s in schedules)))


def resolve_policy(policy: CodecPolicy, device: str) -> Literal["batched", "sequential"]:
    if policy == "auto":
        return "batched" if device.startswith("cuda") else "sequential"
    return policy


def make_decode_runner(codec: SnacCodec, policy: CodecPolicy = "auto", *, tick_s: float = TICK_S, max_batch: int = MAX_BATCH,
                       compile_decoder: bool | None = None, metrics: WorkerMetrics | None = None,
                       schedule: ChunkSchedule | None = None) -> DecodeRunner | BatchedDecodeRunner:
    """The runner for this device: batched (+ compile warm-up) on CUDA, sequential on CPU, unless overridden."""
    chosen = resolve_policy(policy, codec.device)
    if chosen == "sequential":
        return DecodeRunner(codec, metrics=metrics, schedule=schedule)
    runner = BatchedDecodeRunner(codec, tick_s=tick_s, max_batch=max_batch, metrics=metrics, schedule=schedule)
    on_cuda = codec.device.startswith("cuda")
    if on_cuda:
        runner.warm_up(warm_window_lengths(runner.schedule),
                       compile_decoder=on_cuda if compile_decoder is None else compile_decoder)
    return runner
