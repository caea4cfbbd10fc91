"""One context on a connection: buffers pushed text, resolves and loads its voice, speaks
each flushed segment in order, and ends with exactly one `done` or `error` message (or nothing, when
its connection is being cut as a slow consumer). Its outcome is recorded in the worker's metrics
and every log line carries its ``context_id``.

Every limit is checked before anything is buffered, so refused text is never spoken later:
characters buffered before a flush (``max_text_chars``), segments and characters waiting to be
spoken per context, characters waiting per connection (`Backlog`, shared by its contexts), and
how long a context may sit with nothing to speak and no new text (``idle_timeout_s``). A long
segment is spoken as several engine requests (`SpeechEngine.plan`), joined without a gap.

Each context is a span of its request's trace (`trace_context`): a child of the start's
``traceparent``, or a new trace's first span. Its log lines carry the trace id, its `done` the
trace and span ids, and its end is logged as one hop line (``hop=owner``: this engine spoke it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpu_worker.codec import NOISE_PERIOD_LATENT, LATENT_PER_FRAME, ChunkSchedule, to_pcm16
from gpu_worker.engine import SamplingOptions, SpeechEngine, Voice
from gpu_worker.errors import (AlignmentUnavailable, BacklogFull, BadRequest, EmptyText, IdleTimeout,
                               PronunciationsUnavailable, SlowConsumer, TextTooLong, WorkerError)
from gpu_worker.orpheus import SAMPLE_RATE
from gpu_worker.prompt_window import PromptWindow, WindowLimits
from gpu_worker.chunking import clause_cut, sentence_cut
from gpu_worker.protocol import (DEFAULT_MAX_BUFFER_DELAY_MS, MAX_CONTEXT_BACKLOG_CHARS, MAX_TEXT_CHARS, AlignedWord,
                                 Alignment, AudioChunk, ContextStats, Done, Error, Start)
from gpu_worker.scheduler import BatchedDecodeRunner, DecodeRunner
from gpu_worker.speech import SegmentStats, speak_request
from gpu_worker.text import Dictionary, apply, normalize
from gpu_worker.trace_context import Hop, HopKind, TraceContext, current, log_hop
from gpu_worker.trace_context import parse as parse_traceparent

if TYPE_CHECKING:
    from gpu_worker.adapters import AdapterCache
    from gpu_worker.alignment import Aligner, CallerWords, SegmentWords, TimedWord
    from gpu_worker.metrics import WorkerMetrics
    from gpu_worker.pronunciations import PronunciationCache

log = logging.getLogger(__name__)

Send = Callable[[object], Awaitable[None]]
END_OF_SEGMENTS = object()  # sentinel: no more segments


def spoken(text: str, dictionary: Dictionary | None = None, *, normalizes: bool = True) -> str:
    """What the voice reads for a segment: the tenant's pronunciation dictionary first (when the
    request names one), then the text front end's reading (numbers, money, dates, units,
    abbreviations; tags kept whole), the one its clone was trained on (lora_training.text uses the
    same normalizer). ``normalizes=False`` (the caller normalizes itself) applies only the dictionary.
    Applied where the prompt is built: a relay forwards the caller's text and its owner reads it
    once (a relay's local fallback runs this same code)."""
    if not normalizes:
        return apply(dictionary, text).text if dictionary is not None else text
    return normalize(text, dictionary=dictionary).text


class ContextLog(logging.LoggerAdapter):
    """Adds the context's id and voice to every record, keeping per-call ``extra`` too."""

    def process(self, msg, kwargs):  # noqa: ANN001, ANN201 - logging's signature
        kwargs["extra"] = {**self.extra, **kwargs.get("extra", {})}
        return msg, kwargs


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """What one context may hold; every field is a worker setting of the same name."""

    max_text_chars: int = MAX_TEXT_CHARS  # buffered before a flush (one segment)
    max_queued_segments: int = 16  # flushed, not yet being spoken
    max_context_backlog_chars: int = MAX_CONTEXT_BACKLOG_CHARS  # buffered + flushed, not yet being spoken
    idle_timeout_s: float = 30.0  # nothing to speak and no new text for this long ends the context


@dataclass(slots=True)
class Backlog:
    """Characters waiting to be spoken on one connection, across its contexts."""

    limit: int
    chars: int = 0


@dataclass(frozen=True, slots=True)
class ContextDeps:
    engine: SpeechEngine
    runner: DecodeRunner | BatchedDecodeRunner
    defaults: SamplingOptions
    limits: ContextLimits = ContextLimits()
    trim_factory: Callable[[], object] | None = None  # builds a streaming head-silence trimmer
    adapters: AdapterCache | None = None  # resolves voices and loads their adapters
    metrics: WorkerMetrics | None = None
    worker_id: str = ""  # reported as `served_by` in every `done`
    pronunciations: PronunciationCache | None = None  # tenants' dictionaries from Redis (None: no Redis)
    aligner: Aligner | None = None  # word timings (None: a start asking for them is refused)
    window: WindowLimits | None = WindowLimits()  # continuity across segments (None: off on this worker)


class Context:
    """Lives from `start` to `done`/`error`; its run task is owned and cancelled by the connection."""

    def __init__(self, start: Start, deps: ContextDeps, send: Send, voice: Voice | None = None,
                 backlog: Backlog | None = None) -> None:
        """``voice``: already resolved; else ``deps.adapters`` resolves ``start.voice`` when the run begins.
        ``backlog``: the connection's shared character budget (None: this context's limits only)."""
        self.context_id = start.context_id
        self.voice_id = start.voice
        self.proxied = start.proxied_by is not None
        self.voice = voice
        caller = parse_traceparent(start.traceparent) if start.traceparent else None
        self.trace = caller.child() if caller is not None else TraceContext.new()
        self._received_at = time.perf_counter()  # for this hop's timings (`hop`)
        self._received_unix = time.time()
        self._first_audio_at: float | None = None  # when this hop sent its first audio on
        self._log = ContextLog(log, {"context_id": start.context_id, "voice": start.voice,
                                     "trace_id": self.trace.trace_id})
        self.deps = deps
        self.limits = deps.limits
        self._send = send
        self._backlog = backlog
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
        # when each request's first audio is decoded: the caller's choice, else the worker's (the runner's)
        self.schedule = (ChunkSchedule.first_audio_after(o.first_audio_frames) if o.first_audio_frames is not None
                         else None)
        self.normalizes = o.normalize is not False  # the text front end reads it (else: as written)
        if start.pronunciations:
            raise BadRequest("'pronunciations' names dictionaries, which only the gateway resolves; "
                             "a worker takes options.pronunciations (references the gateway makes)")
        self.aligned = o.alignment == "word"  # the server allows it on version-2 connections only
        if self.aligned and deps.aligner is None:
            raise AlignmentUnavailable("this worker cannot time words (it runs without libespeak-ng, or with "
                                       "alignment off); send the start without options.alignment")
        # continuity: the worker's setting decides where the caller leaves it (None) or asks for it
        self.continuous = o.continuity is not False and deps.window is not None
        self.pronunciations = o.pronunciations or ()
        if self.pronunciations and deps.pronunciations is None:
            raise PronunciationsUnavailable("this worker has no Redis to read pronunciation dictionaries from "
                                            "(start it with --redis); send the start without them")
        self._buffer: list[str] = []
        self._buffered_chars = 0
        # chunking "auto": the worker cuts segments itself (gpu_worker.chunking); the delay counts from
        # the oldest text not yet cut
        self.auto_chunking = o.chunking == "auto"
        delay_ms = o.max_buffer_delay_ms if o.max_buffer_delay_ms is not None else DEFAULT_MAX_BUFFER_DELAY_MS
        self._buffer_delay_s = delay_ms / 1000.0
        self._buffered_since = 0.0
        self._delay_timer: asyncio.TimerHandle | None = None
        self._segments: asyncio.Queue[object] = asyncio.Queue()
        self._pending_chars = 0  # buffered + queued, not yet being spoken (counted in the backlog)
        self._queued = 0
        self.input_ended = False
        self._failure: WorkerError | None = None  # set by `fail`: the reason its task is being cancelled
        self._ended = False  # its one `done`/`error` has been claimed
        self._last_activity = time.monotonic()
        self._first_queued_at: float | None = None
        self._ttfb_ms: float | None = None
        self._seq = 0
        self._samples = 0  # audio samples sent so far: the clock word timings count on
        self._timing: SegmentWords | None = None  # the segment being timed (word timings asked for)
        seed = self.options.seed if self.options.seed is not None else random.getrandbits(32)
        self._noise_offset = seed % (NOISE_PERIOD_LATENT // LATENT_PER_FRAME)
        if start.text:
            self.push_text(start.text)

    def push_text(self, text: str) -> None:
        """Buffer text for the current segment; refused whole (nothing buffered) past any limit."""
        if self.input_ended:
            raise BadRequest(f"context '{self.context_id}' already ended its input; text after 'end' is not spoken")
        self._last_activity = time.monotonic()
        n = len(text)
        if self._buffered_chars + n > self.limits.max_text_chars:
            raise TextTooLong(f"text exceeds {self.limits.max_text_chars} characters before a flush; "
                              "flush (or end) at least every few sentences")
        if self._pending_chars + n > self.limits.max_context_backlog_chars:
            raise BacklogFull(f"context '{self.context_id}' has {self._pending_chars} characters waiting to be spoken "
                              f"(limit {self.limits.max_context_backlog_chars}); wait for its audio before sending more")
        if self._backlog is not None and self._backlog.chars + n > self._backlog.limit:
            raise BacklogFull(f"this connection has {self._backlog.chars} characters waiting to be spoken "
                              f"(limit {self._backlog.limit}); wait for audio before sending more")
        if not self._buffered_chars:
            self._buffered_since = time.monotonic()
        self._buffer.append(text)
        self._buffered_chars += n
        self._hold(n)
        if self.auto_chunking:
            self._cut_at(sentence_cut("".join(self._buffer)))
            self._arm_delay()

    def _cut_at(self, at: int | None) -> None:
        """Auto chunking: the buffer's first ``at`` characters become a segment (not now if the
        context's segment queue is full: the text stays buffered and the next push or delay cuts)."""
        if at is None or at <= 0:
            return
        try:
            self._flush(at)
        except BacklogFull:
            return
        if self._buffered_chars:
            self._buffered_since = time.monotonic()

    def _arm_delay(self) -> None:
        if self._delay_timer is not None or not self._buffered_chars or self.input_ended:
            return
        left = self._buffered_since + self._buffer_delay_s - time.monotonic()
        self._delay_timer = asyncio.get_running_loop().call_later(max(0.0, left), self._delay_passed)

    def _delay_passed(self) -> None:
        """The oldest buffered text waited ``max_buffer_delay_ms``: speak what is safe to speak now."""
        self._delay_timer = None
        if self.input_ended or self._ended or not self._buffered_chars:
            return
        self._cut_at(clause_cut("".join(self._buffer)))
        if self._buffered_chars and time.monotonic() - self._buffered_since < self._buffer_delay_s:
            self._arm_delay()  # a cut was made: the rest waits its own delay (else the next push re-arms)

    def _stop_delay(self) -> None:
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None

    def flush(self) -> None:
        if self.input_ended:
            raise BadRequest(f"context '{self.context_id}' already ended its input")
        self._flush()
        self._stop_delay()

    def _flush(self, upto: int | None = None) -> None:
        """Queue the buffer's text (its first ``upto`` characters) as the next segment."""
        self._last_activity = time.monotonic()
        raw = "".join(self._buffer)
        chars = len(raw) if upto is None else upto
        text = " ".join(raw[:chars].split())
        if text and self._segments.qsize() >= self.limits.max_queued_segments:
            raise BacklogFull(f"context '{self.context_id}' has {self._segments.qsize()} segments waiting to be spoken "
                              f"(limit {self.limits.max_queued_segments}); wait for audio before flushing more")
        rest = raw[chars:]
        self._buffer = [rest] if rest else []
        self._buffered_chars = len(rest)
        if not text:
            self._hold(-chars)
            return
        if self._first_queued_at is None:
            self._first_queued_at = time.perf_counter()
        self._queued += 1
        self._segments.put_nowait((text, chars))

    def end(self) -> None:
        if self.input_ended:
            raise BadRequest(f"context '{self.context_id}' already ended its input")
        self._flush()
        self._stop_delay()
        if self._queued == 0:
            raise EmptyText("nothing to speak: the context ended without any text")
        self.input_ended = True
        self._segments.put_nowait(END_OF_SEGMENTS)

    def fail(self, error: WorkerError) -> None:
        """Record why the connection is about to cancel this context (its outcome in metrics)."""
        self._failure = error

    def claim_end(self) -> bool:
        """True once: whoever gets it sends this context's single `done` or `error`."""
        if self._ended:
            return False
        self._ended = True
        return True

    def release(self) -> None:
        """Give this context's unspoken characters back to the connection (its task has ended)."""
        self._hold(-self._pending_chars)

    def _hold(self, chars: int) -> None:
        self._pending_chars += chars
        if self._backlog is not None:
            self._backlog.chars += chars

    async def _next_segment(self) -> object:
        """The next flushed segment; a context with nothing to speak and no new text for
        ``idle_timeout_s`` ends (it would hold a stream slot forever)."""
        while True:
            if not self._segments.empty():
                return self._segments.get_nowait()
            left = self._last_activity + self.limits.idle_timeout_s - time.monotonic()
            if left <= 0:
                raise IdleTimeout(f"no text for {self.limits.idle_timeout_s:.0f} s; the context was closed "
                                  "(send 'end' when a context is complete)")
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancel that lands with the segment
                async with asyncio.timeout(left):
                    return await self._segments.get()
            except TimeoutError:
                continue  # re-check: text may have arrived (it moves the deadline)

    def hop(self, kind: HopKind, outcome: str, *, trace: TraceContext | None = None, to: str = "") -> Hop:
        """This context's hop so far, as `log_hop` logs it at the end."""
        return Hop.ended(kind, trace or self.trace, worker=self.deps.worker_id, to=to, voice=self.voice_id,
                         context=self.context_id, received=self._received_at, received_unix=self._received_unix,
                         first_audio=self._first_audio_at, outcome=outcome)

    async def run(self) -> None:
        token = current.set(self.trace)  # this task's log records carry the trace id
        stats = SegmentStats()
        began = time.perf_counter()
        dropped_ms = 0.0
        outcome = "cancelled"
        acquired = False
        window = PromptWindow(self.deps.window) if self.continuous and self.deps.window is not None else None
        try:
            if self.voice is None:
                if self.deps.adapters is None:
                    raise WorkerError("no adapter cache configured to resolve voices")
                self.voice = await self.deps.adapters.acquire(self.voice_id)
                acquired = True
                self._last_activity = time.monotonic()  # loading a voice is not idling
            dictionary = None
            if self.pronunciations:
                assert self.deps.pronunciations is not None  # checked at the start
                dictionary = await self.deps.pronunciations.dictionary(self.pronunciations)
                self._last_activity = time.monotonic()  # reading dictionaries is not idling
            reading = (functools.partial(spoken, dictionary=dictionary, normalizes=self.normalizes)
                       if self.normalizes or dictionary is not None else None)
            segments = 0
            while (item := await self._next_segment()) is not END_OF_SEGMENTS:
                text, chars = item
                self._hold(-chars)
                segments += 1
                words = await self._segment_words(text, dictionary) if self.aligned else None
                read = (lambda _text, said=words.spoken: said) if words is not None else reading  # read once
                requests = await self.deps.engine.plan(self.voice, text, self.options.max_tokens, reading=read)
                for i, request in enumerate(requests):
                    if words is not None:
                        words.begin(request.text, self._samples / SAMPLE_RATE)
                    trimmer = self.deps.trim_factory() if (self.trim and self.deps.trim_factory) else None
                    seed = self.options.seed
                    options = self.options if seed is None else replace(self.options, seed=seed + stats.requests + 1)
                    spoken_request, generated, earlier = request, None, 0
                    if window is not None:
                        room = self.deps.engine.settings.max_model_len - len(request.prompt) - request.max_tokens
                        before = window.before(room)
                        spoken_request, generated, earlier = replace(request, prompt=[*before, *request.prompt]), [], len(before)
                    async with aclosing(speak_request(
                            self.deps.engine, self.deps.runner, self.voice, spoken_request, options, stats,
                            noise_offset=self._noise_offset, schedule=self.schedule,
                            fade_in=i > 0, fade_out=i < len(requests) - 1,
                            generated=generated, window=earlier)) as audio_out:
                        async for audio in audio_out:
                            if trimmer is not None:
                                audio = trimmer.push(audio)
                            if len(audio):
                                await self._emit(audio, words)
                    if trimmer is not None:
                        tail = trimmer.flush()
                        if len(tail):
                            await self._emit(tail, words)
                        dropped_ms += trimmer.result.dropped_ms
                    if window is not None:
                        window.add(request.prompt, generated)
                    if words is not None:
                        words.end_piece()
                if words is not None:
                    await words.close(self._samples / SAMPLE_RATE)  # every word out before the next segment's
                self._last_activity = time.monotonic()  # idle time counts from when speaking stopped
            audio_s = stats.samples / SAMPLE_RATE
            wall = time.perf_counter() - began
            done = ContextStats(
                ttfb_ms=self._ttfb_ms, audio_s=round(audio_s, 4), tokens=stats.tokens, frames=stats.frames,
                invalid_tokens=stats.invalid_tokens, segments=segments, wall_s=round(wall, 4),
                rtf=round(wall / audio_s, 4) if audio_s else None, head_silence_dropped_ms=round(dropped_ms, 1),
                engine_requests=stats.requests, finish_reason="length" if stats.cut_by_length else "end_of_speech",
                served_by=self.deps.worker_id, proxied=self.proxied, trace_id=self.trace.trace_id,
                span_id=self.trace.span_id, window_tokens=stats.window_tokens,
                window_cached_tokens=stats.window_cached_tokens,
            )
            outcome = "completed"
            if stats.cut_by_length:
                self._log.warning("context %s: %d of %d engine requests ended at their token cap (audio cut short)",
                                  self.context_id, stats.cut_by_length, stats.requests,
                                  extra={"cut_by_length": stats.cut_by_length})
            self._log.info("context %s done: %d frames, %d tokens, ttfb %s ms, rtf %s", self.context_id, stats.frames,
                           stats.tokens, self._ttfb_ms, done.rtf,
                           extra={"frames": stats.frames, "tokens": stats.tokens, "invalid_tokens": stats.invalid_tokens,
                                  "ttfb_ms": self._ttfb_ms, "rtf": done.rtf, "finish_reason": done.finish_reason})
            if self.claim_end():
                await self._send(Done(self.context_id, done))
        except asyncio.CancelledError:
            if self._failure is not None:
                outcome = self._failure.code
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
            self._stop_delay()
            if self._timing is not None:
                self._timing.cancel()  # a cancelled or failed context sends no more timings
            if acquired and self.deps.adapters is not None and self.voice is not None:
                self.deps.adapters.release(self.voice)
            self._record(outcome, stats, time.perf_counter() - began)
            log_hop(log, self.hop("owner", outcome))
            current.reset(token)

    async def _send_final(self, message: object) -> None:
        if not self.claim_end():
            return
        try:
            await self._send(message)
        except SlowConsumer:
            pass

    def _record(self, outcome: str, stats: SegmentStats, wall: float) -> None:
        metrics = self.deps.metrics
        if metrics is None:
            return
        audio_s = stats.samples / SAMPLE_RATE
        metrics.observe_context(
            outcome=outcome, ttfb_s=None if self._ttfb_ms is None else self._ttfb_ms / 1000.0,
            rtf=wall / audio_s if outcome == "completed" and audio_s else None, tokens=stats.tokens,
            invalid_tokens=stats.invalid_tokens, audio_s=audio_s, generation_s=wall if outcome == "completed" else 0.0,
            requests=stats.requests, cut_by_length=stats.cut_by_length, spoke_to_end=stats.spoke_to_end,
            window_tokens=stats.window_tokens, window_cached_tokens=stats.window_cached_tokens,
        )

    async def _emit(self, audio, words: SegmentWords | None = None) -> None:
        if self._ttfb_ms is None and self._first_queued_at is not None:
            self._ttfb_ms = round((time.perf_counter() - self._first_queued_at) * 1000.0, 2)
        if self._first_audio_at is None:
            self._first_audio_at = time.perf_counter()
        await self._send(AudioChunk(self.context_id, self._seq, to_pcm16(audio)))
        self._seq += 1
        self._samples += len(audio)
        if words is not None:  # after the audio: timings never precede what they describe
            words.feed(audio)

    async def _segment_words(self, text: str, dictionary: Dictionary | None) -> SegmentWords:
        """The caller's words of one segment, read as the prompt reads them (off the loop); its
        task is cancelled when the context ends however it ends (`run`)."""
        assert self.deps.aligner is not None
        caller = await self.deps.aligner.run(self._caller_words, text, dictionary)
        words = self.deps.aligner.segment(caller, self._send_words)
        self._timing = words
        return words

    def _caller_words(self, text: str, dictionary: Dictionary | None) -> CallerWords:
        from gpu_worker.alignment import CallerWords

        if self.normalizes:
            return CallerWords.of(normalize(text, dictionary=dictionary))
        return CallerWords.verbatim(spoken(text, dictionary, normalizes=False))

    async def _send_words(self, words: list[TimedWord], estimated: bool) -> None:
        if words and not self._ended:
            await self._send(Alignment(self.context_id, tuple(AlignedWord(w.text, round(w.start_s, 3),
                                                                          round(w.end_s, 3)) for w in words),
                                       estimated=estimated))
