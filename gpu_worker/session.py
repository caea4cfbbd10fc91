"""One utterance (context) on a connection: buffers pushed text, speaks each flushed segment in order,
and ends with exactly one `done` or `error` message."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from gpu_worker.codec import NOISE_PERIOD_LATENT, LATENT_PER_FRAME, to_pcm16
from gpu_worker.engine import SamplingOptions, SpeechEngine, Voice
from gpu_worker.errors import EmptyText, TextTooLong, WorkerError
from gpu_worker.orpheus import SAMPLE_RATE
from gpu_worker.protocol import AudioChunk, Done, Error, Start, UtteranceStats
from gpu_worker.scheduler import DecodeRunner
from gpu_worker.speech import SegmentStats, speak_segment

log = logging.getLogger(__name__)

Send = Callable[[object], Awaitable[None]]
_END = object()  # sentinel: no more segments


@dataclass(frozen=True, slots=True)
class SessionDeps:
    engine: SpeechEngine
    runner: DecodeRunner
    defaults: SamplingOptions
    max_text_chars: int
    trim_factory: Callable[[], object] | None = None  # builds a streaming head-silence trimmer


class Utterance:
    """Lives from `start` to `done`/`error`; its run task is owned and cancelled by the connection."""

    def __init__(self, start: Start, voice: Voice, deps: SessionDeps, send: Send) -> None:
        self.context_id = start.context_id
        self.voice = voice
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
        self._segments: asyncio.Queue[object] = asyncio.Queue()
        self._queued = 0
        self._first_queued_at: float | None = None
        self._ttfb_ms: float | None = None
        self._seq = 0
        seed = self.options.seed if self.options.seed is not None else random.getrandbits(32)
        self._noise_offset = seed % (NOISE_PERIOD_LATENT // LATENT_PER_FRAME)
        self.ended = False
        if start.text:
            self.push_text(start.text)

    def push_text(self, text: str) -> None:
        self._buffer.append(text)
        if sum(len(t) for t in self._buffer) > self.deps.max_text_chars:
            raise TextTooLong(f"text exceeds {self.deps.max_text_chars} characters; split it into several flushes")

    def flush(self) -> None:
        text = " ".join("".join(self._buffer).split())
        self._buffer.clear()
        if not text:
            return
        if self._first_queued_at is None:
            self._first_queued_at = time.perf_counter()
        self._queued += 1
        self._segments.put_nowait(text)

    def end(self) -> None:
        self.flush()
        self.ended = True
        if self._queued == 0:
            raise EmptyText("nothing to speak: the utterance ended without any text")
        self._segments.put_nowait(_END)

    async def run(self) -> None:
        stats = SegmentStats()
        began = time.perf_counter()
        dropped_ms = 0.0
        try:
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
                    dropped_ms += trimmer.dropped_ms
            audio_s = stats.samples / SAMPLE_RATE
            wall = time.perf_counter() - began
            await self._send(Done(self.context_id, UtteranceStats(
                ttfb_ms=self._ttfb_ms, audio_s=round(audio_s, 4), tokens=stats.tokens, frames=stats.frames,
                invalid_tokens=stats.invalid_tokens, segments=segments, wall_s=round(wall, 4),
                rtf=round(wall / audio_s, 4) if audio_s else None, head_silence_dropped_ms=round(dropped_ms, 1),
            )))
        except asyncio.CancelledError:
            raise
        except WorkerError as exc:
            log.warning("context %s failed: %s", self.context_id, exc.message)
            await self._send(Error(exc.code, exc.message, exc.retryable, self.context_id))
        except Exception as exc:  # a bug must not take the connection down with it
            log.exception("context %s crashed", self.context_id)
            await self._send(Error("internal", f"internal error: {type(exc).__name__}", True, self.context_id))

    async def _emit(self, audio) -> None:
        if self._ttfb_ms is None and self._first_queued_at is not None:
            self._ttfb_ms = round((time.perf_counter() - self._first_queued_at) * 1000.0, 2)
        await self._send(AudioChunk(self.context_id, self._seq, to_pcm16(audio)))
        self._seq += 1
