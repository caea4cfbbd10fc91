"""One utterance (context) on a connection: buffers pushed text, resolves and loads its voice, speaks
each flushed segment in order, and ends with exactly one `done` or `error` message (or nothing, when
its connection is being cut as a slow consumer). Its outcome is recorded in the worker's metrics
and every log line carries its ``context_id``."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpu_worker.codec import NOISE_PERIOD_LATENT, LATENT_PER_FRAME, to_pcm16
from gpu_worker.engine import SamplingOptions, SpeechEngine, Voice
from gpu_worker.errors import EmptyText, SlowConsumer, TextTooLong, WorkerError
from gpu_worker.orpheus import SAMPLE_RATE
from gpu_worker.protocol import AudioChunk, Done, Error, Start, UtteranceStats
from gpu_worker.scheduler import BatchedDecodeRunner, DecodeRunner
from gpu_worker.speech import SegmentStats, speak_segment

if TYPE_CHECKING:
    from gpu_worker.adapters import AdapterCache
    from gpu_worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

Send = Callable[[object], Awaitable[None]]
_END = object()  # sentinel: no more segments


class ContextLog(logging.LoggerAdapter):
    """Adds the utterance's context id and voice to every record, keeping per-call ``extra`` too."""

    def process(self, msg, kwargs):  # noqa: ANN001, ANN201 - logging's signature
        kwargs["extra"] = {**self.extra, **kwargs.get("extra", {})}
        return msg, kwargs


@dataclass(frozen=True, slots=True)
class SessionDeps:
    engine: SpeechEngine
    runner: DecodeRunner | BatchedDecodeRunner
    defaults: SamplingOptions
    max_text_chars: int
    trim_factory: Callable[[], object] | None = None  # builds a streaming head-silence trimmer
    adapters: AdapterCache | None = None  # resolves voices and loads their adapters
    metrics: WorkerMetrics | None = None


class Utterance:
    """Lives from `start` to `done`/`error`; its run task is owned and cancelled by the connection."""

    def __init__(self, start: Start, deps: SessionDeps, send: Send, voice: Voice | None = None) -> None:
        """``voice``: already resolved; else ``deps.adapters`` resolves ``start.voice`` when the run begins."""
        self.context_id = start.context_id
        self.voice_id = start.voice
        self.voice = voice
        self._log = ContextLog(log, {"context_id": start.context_id, "voice": start.voice})
        self.deps = deps
        self._send = send
        o = start.options
        d = deps.defaults
        self.options = replace(
            d,
            temperature=d.temperature if o.temperature is None else o.temperature,
            top_p=d.top_p if o.top_p is None else o.top_p,
            repetition_penalty=d.repetition_penalty if o.repetition_penalty is None else o.repetition_penalty,
            max_tokens=o.max_tokens or d.max_tokens,
            seed=o.seed if o.seed is not None else d.seed,
            constraint=o.constraint or d.constraint,
        )
        self.trim = o.trim_silence if o.trim_silence is not None else deps.trim_factory is not None
        self._buffer: list[str] = []
        self._buffered_chars = 0
        self._segments: asyncio.Queue[object] = asyncio.Queue()
        self._queued = 0
        self._first_queued_at: float | None = None
        self._ttfb_ms: float | None = None
        self._seq = 0
        seed = self.options.seed if self.options.seed is not None else random.getrandbits(32)
        self._noise_offset = seed % (NOISE_PERIOD_LATENT // LATENT_PER_FRAME)
        if start.text:
            self.push_text(start.text)

    def push_text(self, text: str) -> None:
        self._buffer.append(text)
        self._buffered_chars += len(text)
        if self._buffered_chars > self.deps.max_text_chars:
            raise TextTooLong(f"text exceeds {self.deps.max_text_chars} characters; split it into several flushes")

    def flush(self) -> None:
        text = " ".join("".join(self._buffer).split())
        self._buffer.clear()
        self._buffered_chars = 0
        if not text:
            return
        if self._first_queued_at is None:
            self._first_queued_at = time.perf_counter()
        self._queued += 1
        self._segments.put_nowait(text)

    def end(self) -> None:
        self.flush()
        if self._queued == 0:
            raise EmptyText("nothing to speak: the utterance ended without any text")
        self._segments.put_nowait(_END)

    async def run(self) -> None:
        stats = SegmentStats()
        began = time.perf_counter()
        dropped_ms = 0.0
        outcome = "cancelled"
        acquired = False
        try:
            if self.voice is None:
                if self.deps.adapters is None:
                    raise WorkerError("no adapter cache configured to resolve voices")
                self.voice = await self.deps.adapters.acquire(self.voice_id)
                acquired = True
            segments = 0
            while (text := await self._segments.get()) is not _END:
                segments += 1
                trimmer = self.deps.trim_factory() if (self.trim and self.deps.trim_factory) else None
                options = self.options if self.options.seed is None else replace(self.options, seed=self.options.seed + segments)
                async for audio in speak_segment(self.deps.engine, self.deps.runner, self.voice, text, options, stats,
                                                 noise_offset=self._noise_offset):
                    if trimmer is not None:
                        audio = trimmer.push(audio)
                    if len(audio):
                        await self._emit(audio)
                if trimmer is not None:
                    tail = trimmer.flush()
                    if len(tail):
                        await self._emit(tail)
                    dropped_ms += trimmer.result.dropped_ms
            audio_s = stats.samples / SAMPLE_RATE
            wall = time.perf_counter() - began
            done = UtteranceStats(
                ttfb_ms=self._ttfb_ms, audio_s=round(audio_s, 4), tokens=stats.tokens, frames=stats.frames,
                invalid_tokens=stats.invalid_tokens, segments=segments, wall_s=round(wall, 4),
                rtf=round(wall / audio_s, 4) if audio_s else None, head_silence_dropped_ms=round(dropped_ms, 1),
            )
            outcome = "completed"
            self._log.info("context %s done: %d frames, %d tokens, ttfb %s ms, rtf %s", self.context_id, stats.frames,
                           stats.tokens, self._ttfb_ms, done.rtf,
                           extra={"frames": stats.frames, "tokens": stats.tokens, "invalid_tokens": stats.invalid_tokens,
                                  "ttfb_ms": self._ttfb_ms, "rtf": done.rtf})
            await self._send(Done(self.context_id, done))
        except asyncio.CancelledError:
            raise
        except SlowConsumer as exc:  # the connection is being cut: nothing more can reach this client
            outcome = exc.code
            self._log.warning("context %s cut: %s", self.context_id, exc.message)
        except WorkerError as exc:
            outcome = exc.code
            self._log.warning("context %s failed: %s", self.context_id, exc.message, extra={"code": exc.code})
            await self._send_final(Error(exc.code, exc.message, exc.retryable, self.context_id))
        except Exception as exc:  # a bug must not take the connection down with it
            outcome = "internal"
            self._log.exception("context %s crashed", self.context_id)
            await self._send_final(Error("internal", f"internal error: {type(exc).__name__}", True, self.context_id))
        finally:
            if acquired and self.deps.adapters is not None and self.voice is not None:
                self.deps.adapters.release(self.voice)
            self._record(outcome, stats, time.perf_counter() - began)

    async def _send_final(self, message: object) -> None:
        try:
            await self._send(message)
        except SlowConsumer:
            pass

    def _record(self, outcome: str, stats: SegmentStats, wall: float) -> None:
        metrics = self.deps.metrics
        if metrics is None:
            return
        audio_s = stats.samples / SAMPLE_RATE
        metrics.observe_utterance(
            outcome=outcome, ttfb_s=None if self._ttfb_ms is None else self._ttfb_ms / 1000.0,
            rtf=wall / audio_s if outcome == "completed" and audio_s else None, tokens=stats.tokens,
            invalid_tokens=stats.invalid_tokens, audio_s=audio_s, generation_s=wall if outcome == "completed" else 0.0,
        )

    async def _emit(self, audio) -> None:
        if self._ttfb_ms is None and self._first_queued_at is not None:
            self._ttfb_ms = round((time.perf_counter() - self._first_queued_at) * 1000.0, 2)
        await self._send(AudioChunk(self.context_id, self._seq, to_pcm16(audio)))
        self._seq += 1
