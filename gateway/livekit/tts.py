"""voicering as a livekit-agents 1.8 TTS: cloned Orpheus voices from the GPU fleet.

    tts = TTS(voice="tara", ring="redis://10.0.0.5:6379/0", cluster_token=token)
    session = AgentSession(stt=..., llm=..., tts=tts)

**Routing.** `ring=` (a Redis URL, or a `RingWatcher` the caller runs) sends each context to the
voice's owning worker over the shared `gpu_worker.client.pool.WorkerPool`: one multiplexed websocket per
worker for every stream of this TTS, so a turn costs no handshake and an interrupted turn costs no
reconnect. `workers=[url, ...]` does the same over fixed URLs. `transport=` plugs in any other
`gateway.livekit.transport.Transport` (the public gateway's websocket, for apps outside the
platform).

**Streaming** (`stream()`, what the agent's `tts_node` uses): one worker context per stream,
opened at the first non-blank text; text is forwarded as it arrives and the worker cuts it into
segments itself (`chunking: "auto"`, docs/protocol.md: a segment ends at a sentence end it can
tell from "Dr." or "3.5", or past `max_buffer_delay_ms` at a clause or word break), so the first
sentence is heard while the LLM still writes; livekit's `flush()` asks the worker to speak what it
holds at once. `min_sentence_chars=N` cuts in the plugin instead (`sentences.py`: a flush after
each complete sentence, shorter ones joined to the next), as before the worker could. Audio is
pushed to the framework chunk by chunk. `aclose()` (an
interruption) cancels the context on the worker at once (its engine request is aborted) and
nothing of it is emitted afterwards. A turn with no text ends cleanly: no context, no audio, no
"no audio frames" error. `synthesize()` speaks one text as one context.

**Errors** (worker-protocol codes -> livekit's, in `api_error`): retryable only while none of the
stream's audio reached the framework (its retry replays the input; the pool has already tried
other replicas by then), never after: `busy`, `no_worker`, `engine_error`, `worker_timeout`, a
lost connection -> `APIConnectionError` (retryable); `unknown_voice` -> `APIStatusError` 404
naming the voice; `bad_request`/`empty_text` 400, `text_too_long` 413, `bad_adapter` 422 (not
retryable); `worker_lost` and every error after the first audio -> not retryable. `body` holds
``{"code", "voice"}``.

**Aligned transcripts** (`aligned_transcript=True`, the default): every context asks the worker
for word timings (`alignment: "word"`, docs/alignment.md), and each timed word is pushed to the
framework as a `TimedString` ("word " with `start_time`/`end_time` on the turn's audio clock), so
livekit's transcription sync follows the voice and an interruption keeps in the chat history
only the words played. `aligned_transcript=False` leaves it to livekit's speaking-rate estimate.

**Metrics**: the framework's `metrics_collected` (`TTSMetrics`: TTFB from the first text sent,
audio duration, ...) with `acquire_time` (routing + connection + start) and `connection_reused`
(no handshake was needed) filled in by this plugin.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APIStatusError, APITimeoutError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr, TimedString
from livekit.agents.utils import is_given

from gateway.livekit.log import logger as log  # livekit.plugins.voicering
from gateway.livekit.sentences import SentenceSplitter
from gateway.livekit.transport import Opened, PoolTransport, Transport, Context
from gpu_worker.client import PoolSettings, WorkerRequestError
from gpu_worker.protocol import Alignment, ContextOptions, Done
from hashring.errors import InvalidVoiceId
from hashring.membership import RingWatcher
from hashring.records import check_voice_id
from hashring.settings import RingSettings

__all__ = ["NUM_CHANNELS", "SAMPLE_RATE", "ChunkedStream", "SynthesizeStream", "TTS", "TTSOptions", "api_error",
           "context_options"]

SAMPLE_RATE = 24000  # what every worker sends: 24 kHz mono s16le (docs/protocol.md)
NUM_CHANNELS = 1
CANCEL_TIMEOUT_S = 1.0  # the longest closing a stream waits to hand the worker its cancel
_STATUS = {"unknown_voice": 404, "bad_request": 400, "empty_text": 400, "text_too_long": 413, "bad_adapter": 422,
           # the public gateway's own codes (GatewayTransport)
           "voice_not_found": 404, "unauthorized": 401, "voice_not_ready": 409, "gateway_refused": 403}
_RATE_LIMITED = frozenset({"streams_limit_exceeded", "requests_limit_exceeded"})  # the tenant's limits: 429
_CONNECTION = frozenset({"busy", "no_worker", "engine_error", "internal", "worker_timeout", "worker_lost"})


@dataclass(frozen=True, slots=True)
class TTSOptions:
    """What a stream speaks with; copied into each stream when it starts (`update_options` never
    reaches a running stream)."""

    voice: str
    context: ContextOptions = field(default_factory=ContextOptions)  # seed, temperature, max_tokens, ...
    # None: the worker cuts the text into segments (`context.chunking` "auto"); N: the plugin does,
    # sentences of under N visible characters spoken with the next
    min_sentence_chars: int | None = None


def context_options(options: ContextOptions, *, aligned: bool, min_sentence_chars: int | None) -> ContextOptions:
    """What every context of the plugin asks the worker for: word timings when the transcript is
    aligned, and the worker's own segmenting unless the plugin cuts (``min_sentence_chars``)."""
    if min_sentence_chars is not None:
        if min_sentence_chars < 0:
            raise ValueError("min_sentence_chars must be >= 0 (or None: the worker cuts the text)")
        if options.chunking is not None:
            raise ValueError("min_sentence_chars cuts the text in the plugin; options.chunking asks the worker to: "
                             "give one of them")
    elif options.chunking is None:
        options = replace(options, chunking="auto")
    if aligned and options.alignment is None:
        options = replace(options, alignment="word")
    return options


def api_error(exc: WorkerRequestError, voice: str, *, after_audio: bool) -> APIError:
    """livekit's error for a failed context; never retryable once its audio reached the framework."""
    e = exc.error
    retryable = e.retryable and not after_audio
    body = {"code": e.code, "voice": voice}
    if e.code in _RATE_LIMITED:
        return APIStatusError(f"voicering: {e.message}", status_code=429, body=body, retryable=retryable)
    if e.code in ("unknown_voice", "voice_not_found"):
        return APIStatusError(f"voice {voice!r} is not available on the voicering fleet: {e.message}", status_code=404,
                              body=body, retryable=False)
    if e.code in _STATUS:
        return APIStatusError(f"voicering refused the context ({e.code}): {e.message}", status_code=_STATUS[e.code],
                              body=body, retryable=False)
    if e.code in _CONNECTION:
        error = APIConnectionError(f"voicering: {e.code}: {e.message}", retryable=retryable)
        error.body = body
        return error
    return APIError(f"voicering: {e.code}: {e.message}", body=body, retryable=retryable)


def _voice(voice: str) -> str:
    try:
        return check_voice_id(voice)
    except InvalidVoiceId as exc:
        raise ValueError(exc.message) from None


class TTS(tts.TTS):
    def __init__(self, *, voice: str, ring: str | RingWatcher | None = None, workers: Sequence[str] | None = None,
                 transport: Transport | None = None, cluster_token: str | None = None,
                 options: ContextOptions | None = None, ring_settings: RingSettings | None = None,
                 pool_settings: PoolSettings | None = None,
                 min_sentence_chars: int | None = None, aligned_transcript: bool = True) -> None:
        """Exactly one of ``ring`` (Redis URL or running `RingWatcher`), ``workers`` (URLs) or
        ``transport``. ``cluster_token``: the workers' `VOICERING_WORKER_CLUSTER_TOKEN`.
        ``ring_settings``: the fleet's (prefix, vnodes, replicas); ``options``: per-context knobs.
        ``min_sentence_chars``: None, the worker cuts streamed text into segments; N, the plugin
        does (a flush per sentence of N+ visible characters). ``aligned_transcript``: word timings
        from the workers for livekit's transcript."""
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=aligned_transcript),
                         sample_rate=SAMPLE_RATE, num_channels=NUM_CHANNELS)
        if sum(x is not None for x in (ring, workers, transport)) != 1:
            raise ValueError("give exactly one of ring= (a Redis URL or RingWatcher), workers= (URLs) or transport=")
        options = context_options(options or ContextOptions(), aligned=aligned_transcript,
                                  min_sentence_chars=min_sentence_chars)
        self._opts = TTSOptions(_voice(voice), options, min_sentence_chars)
        if ring is not None:
            transport = PoolTransport.ring(ring, settings=ring_settings, token=cluster_token, pool_settings=pool_settings)
        elif workers is not None:
            transport = PoolTransport.static(list(workers), token=cluster_token, pool_settings=pool_settings)
        assert transport is not None
        self._transport = transport
        self._streams: weakref.WeakSet[SynthesizeStream] = weakref.WeakSet()
        self._prewarm_task: asyncio.Task[int] | None = None

    @property
    def model(self) -> str:
        return "orpheus"

    @property
    def provider(self) -> str:
        return "voicering"

    @property
    def options(self) -> TTSOptions:
        return self._opts

    @property
    def transport(self) -> Transport:
        return self._transport

    def update_options(self, *, voice: str | None = None, options: ContextOptions | None = None,
                       min_sentence_chars: NotGivenOr[int | None] = NOT_GIVEN) -> None:
        """Applies to streams started from now on; running ones keep the options they started with.
        ``min_sentence_chars=None`` hands the cutting back to the worker."""
        voice = self._opts.voice if voice is None else _voice(voice)
        cut = min_sentence_chars if is_given(min_sentence_chars) else self._opts.min_sentence_chars
        if options is None:  # the options in force, less what the plugin added for the old cut
            options = self._opts.context
            if self._opts.min_sentence_chars is None and cut is not None:
                options = replace(options, chunking=None, max_buffer_delay_ms=None)
        options = context_options(options, aligned=self.capabilities.aligned_transcript, min_sentence_chars=cut)
        self._opts = TTSOptions(voice, options, cut)

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    def prewarm(self) -> None:
        """Start opening connections to the voice's workers (the framework calls this without awaiting)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            log.debug("prewarm called outside an event loop: the first turn dials instead")
            return
        if self._prewarm_task is None or self._prewarm_task.done():
            self._prewarm_task = asyncio.create_task(self._prewarm(), name="voicering-tts-prewarm")

    async def warm(self) -> int:
        """Open connections to the voice's workers now; returns how many are connected."""
        return await self._transport.prewarm(self._opts.voice)

    async def aclose(self) -> None:
        """Close every open stream (their worker contexts are cancelled), then the connections."""
        if self._prewarm_task is not None:
            await utils.aio.cancel_and_wait(self._prewarm_task)
        await asyncio.gather(*(stream.aclose() for stream in list(self._streams)), return_exceptions=True)
        await self._transport.aclose()

    async def _prewarm(self) -> int:
        try:
            return await self.warm()
        except WorkerRequestError as exc:
            log.warning("prewarm of voice %r failed (the first turn dials instead): %s", self._opts.voice, exc)
            return 0


class _Speech:
    """One attempt's context: opened on its first text, drained into the emitter, and cancelled on
    the worker unless it completed. Maps every transport error to livekit's at this boundary."""

    def __init__(self, transport: Transport, opts: TTSOptions, emitter: tts.AudioEmitter,
                 conn_options: APIConnectOptions) -> None:
        self._transport = transport
        self._opts = opts
        self._emitter = emitter
        self._conn_options = conn_options
        self.opened: Opened | None = None
        self.audio_pushed = False
        self.alignments: list[Alignment] = []  # the word timings pushed, as the worker sent them

    @property
    def context(self) -> Context | None:
        return self.opened.context if self.opened else None

    @property
    def done(self) -> Done | None:
        """The worker's `done` once the context completed."""
        context = self.context
        return context.done if context else None

    async def open(self, text: str) -> Opened:
        try:
            async with asyncio.timeout(self._conn_options.timeout or None):
                self.opened = await self._transport.open(self._opts.voice, text, self._opts.context)
        except TimeoutError:
            raise APITimeoutError(f"voicering: no worker took voice {self._opts.voice!r} within "
                                  f"{self._conn_options.timeout:g} s") from None
        except WorkerRequestError as exc:
            raise api_error(exc, self._opts.voice, after_audio=False) from exc
        return self.opened

    async def send(self, text: str, flush: bool) -> None:
        context = self.context
        assert context is not None
        try:
            if text:
                await context.push(text)
            if flush:
                await context.flush()
        except WorkerRequestError as exc:
            raise api_error(exc, self._opts.voice, after_audio=self.audio_pushed) from exc

    async def end(self) -> None:
        context = self.context
        assert context is not None
        try:
            await context.end()
        except WorkerRequestError as exc:
            raise api_error(exc, self._opts.voice, after_audio=self.audio_pushed) from exc

    async def drain(self) -> None:
        """Push every chunk to the emitter as it arrives, until the worker's `done`."""
        context = self.context
        assert context is not None
        try:
            async for item in context.events():
                if isinstance(item, Alignment):  # "word " as livekit's aligned TTS plugins send them
                    self._emitter.push_timed_transcript([TimedString(f"{w.text} ", start_time=w.start_s,
                                                                     end_time=w.end_s) for w in item.words])
                    self.alignments.append(item)
                    continue
                self._emitter.push(item)
                self.audio_pushed = True
        except WorkerRequestError as exc:
            raise api_error(exc, self._opts.voice, after_audio=self.audio_pushed) from exc
        done = context.done
        if done is not None and done.stats.finish_reason == "length":
            log.debug("voicering: an engine request of voice %r hit its max_tokens; its audio is cut short",
                      self._opts.voice)

    async def aclose(self) -> None:
        """Cancel the context on the worker unless it completed (interrupted, failed elsewhere)."""
        context = self.context
        if context is None or context.done is not None:
            return
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                await context.cancel()
        except (TimeoutError, WorkerRequestError) as exc:
            log.warning("voicering: could not cancel a context of voice %r (%s); the worker ends it when its "
                        "connection closes or its idle timeout passes", self._opts.voice, exc)


class ChunkedStream(tts.ChunkedStream):
    """`synthesize()`: one text, one context."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        self._opts = replace(tts.options)  # before the framework starts _run
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts
        self.worker_done: Done | None = None  # the worker's `done` once spoken: `.stats.served_by` names the worker

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(request_id=utils.shortuuid(), sample_rate=SAMPLE_RATE, num_channels=NUM_CHANNELS,
                                  mime_type="audio/pcm")
        if not self._input_text.strip():
            return  # nothing to say: no context, and the framework expects no audio
        speech = _Speech(self._tts.transport, self._opts, output_emitter, self._conn_options)
        try:
            opened = await speech.open(self._input_text)
            self._acquire_time, self._connection_reused = opened.acquire_s, opened.connection_reused
            await speech.end()
            await speech.drain()
            self.worker_done = speech.done
        finally:
            await speech.aclose()


class SynthesizeStream(tts.SynthesizeStream):
    """`stream()`: one speech turn, LLM text in as it comes, audio out as it comes."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        self._opts = replace(tts.options)  # before the framework starts _run
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self.worker_done: Done | None = None  # the worker's `done` once spoken: `.stats.served_by` names the worker

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(request_id=utils.shortuuid(), sample_rate=SAMPLE_RATE, num_channels=NUM_CHANNELS,
                                  mime_type="audio/pcm", stream=True)
        speech = _Speech(self._tts.transport, self._opts, output_emitter, self._conn_options)
        cut = self._opts.min_sentence_chars
        splitter = SentenceSplitter(cut) if cut is not None else None  # None: the worker cuts
        opened = asyncio.Event()  # set once the context is open, or when input ended without one

        async def send(text: str, flush: bool) -> None:
            if speech.opened is not None:
                await speech.send(text, flush)
                return
            if not text.strip():
                return  # nothing to open a context for yet (a flush of nothing is nothing)
            self._mark_started()
            started = await speech.open(text)
            self._acquire_time, self._connection_reused = started.acquire_s, started.connection_reused
            output_emitter.start_segment(segment_id=utils.shortuuid())
            opened.set()
            if flush:
                await speech.send("", True)

        async def forward_text() -> None:
            try:
                async for item in self._input_ch:
                    flush = isinstance(item, self._FlushSentinel)
                    if splitter is None:
                        await send("" if flush else item, flush)
                        continue
                    for piece in splitter.flush() if flush else splitter.feed(item):
                        await send(piece.text, piece.flush)
                for piece in splitter.end() if splitter is not None else ():
                    await send(piece.text, piece.flush)
                if speech.opened is not None:
                    await speech.end()
            finally:
                opened.set()

        async def forward_audio() -> None:
            await opened.wait()
            if speech.opened is None:
                return  # an empty turn: no context was opened
            await speech.drain()
            self.worker_done = speech.done
            output_emitter.end_segment()

        tasks = [asyncio.create_task(forward_text(), name="voicering-tts-text"),
                 asyncio.create_task(forward_audio(), name="voicering-tts-audio")]
        try:
            await asyncio.gather(*tasks)
        finally:
            await utils.aio.cancel_and_wait(*tasks)  # audio stops here: nothing of this context is emitted after
            await speech.aclose()
