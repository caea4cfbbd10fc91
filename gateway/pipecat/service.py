"""Pipecat's text-to-speech service for voicering: `/v1/tts/stream` on the public gateway with a
tenant API key, built the way Pipecat's own websocket services with word timestamps are
(Cartesia's, ElevenLabs'): a `WebsocketTTSService` holding one websocket for all of its turns, with
Pipecat's receive loop, audio contexts, metrics and reconnection.

    a turn's sentences -> run_tts -> `start` (the first one), then `text` + `flush` -> the gateway
    the LLM response ends -> flush_audio -> `end`
    binary audio frames (24 kHz s16le) -> TTSAudioRawFrame, in the turn's audio context
    `alignment` (word timings) -> add_word_timestamps -> a TTSTextFrame with a PTS per word
    `done` / `error` -> TTSStoppedFrame / ErrorFrame with the gateway's code and message
    InterruptionFrame -> `cancel` (the gateway aborts the worker's engine request at once)

**One context per turn.** Pipecat gives the sentences of one turn one context id; a
`TTSSpeakFrame` is a turn of its own. Settings are copied into a context's `start`, so an update
speaks from the next turn.

**Drains.** A stopping gateway refuses new contexts with `going_away` and closes the socket with
1001 once its open contexts end. A context refused so, or cut before any of its audio arrived, is
started again on a new socket (the same URL: another gateway takes it) by replaying its messages,
kept for that until its first audio (bounded); the old socket is read until it closes, so its
contexts finish. A socket closed with 1001 while idle is redialed with Pipecat's back-off
(``reconnect_attempts``). Audio already heard is never replayed.

Light: pipecat, websockets and the worker protocol's messages (`gpu_worker.protocol`); never
FastAPI, torch or vLLM (tests/gateway/test_pipecat_package.py checks it in a fresh interpreter).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.frames.frames import Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.utils.errors import ErrorCategory
from pipecat.utils.network import exponential_backoff_time
from pipecat.utils.tracing.service_decorators import traced_tts
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidStatus, WebSocketException
from websockets.frames import CloseCode
from websockets.protocol import State

from gateway.pipecat.errors import VoiceringError, from_status
from gateway.pipecat.settings import VoiceringTTSSettings, check_settings, default_settings, start_message
from gpu_worker.errors import BadRequest
from gpu_worker.protocol import (MAX_CONTEXT_BACKLOG_CHARS, MAX_MESSAGE_BYTES, SAMPLE_RATE, Alignment, AudioChunk,
                                 Cancel, Done, End, Error, Flush, PushText, Rejected, encode, parse_server)

__all__ = ["VoiceringTTSService", "stream_url"]

STREAM_PATH = "/v1/tts/stream"
# A context's messages kept for a replay until its first audio: the gateway itself holds at most
# MAX_CONTEXT_BACKLOG_CHARS characters of a context before its audio; twice that leaves room for
# the JSON around them. A context past it is not replayable (the gateway would refuse it anyway).
REPLAY_CHARS = 2 * MAX_CONTEXT_BACKLOG_CHARS


def stream_url(url: str) -> str:
    """The gateway's base URL (`https://voices.example.com`, `ws://127.0.0.1:8000`) as the stream's."""
    base = url.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return base if base.endswith(STREAM_PATH) else base + STREAM_PATH


@dataclass(eq=False)
class _Context:
    """One turn's context on the gateway, as this service sees it."""

    id: str
    ws: ClientConnection | None  # the socket it lives on; None while it waits to be started on a new one
    sent: list[str] | None = field(default_factory=list)  # its messages before any audio (None: not replayable)
    sent_chars: int = 0
    started_at: float = 0.0  # perf_counter when its `start` was handed to the socket
    first_audio_at: float | None = None  # its first audio frame read off the socket
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)  # its messages in order, a replay's included

    def keep(self, message: str) -> None:
        if self.sent is None:
            return
        self.sent_chars += len(message)
        if self.sent_chars > REPLAY_CHARS:
            self.sent = None
        else:
            self.sent.append(message)

    def heard(self) -> None:
        if self.first_audio_at is None:
            self.first_audio_at = time.perf_counter()
            self.sent = None  # from now on a replay would repeat what the listener heard


class VoiceringTTSService(WebsocketTTSService):
    """voicering's voices in a Pipecat pipeline, through the gateway's `/v1/tts/stream`.

    Example::

        tts = VoiceringTTSService(
            api_key=os.environ["VOICERING_API_KEY"],
            url="https://voices.example.com",
            settings=VoiceringTTSService.Settings(voice="my-clone", seed=7),
        )

    Audio is 24 kHz mono (the transport resamples it to its own rate). Word timestamps are on by
    default (``Settings(alignment=False)`` turns them off). ``sockets_opened`` counts the
    websockets the service opened over its life.
    """

    Settings = VoiceringTTSSettings
    _settings: VoiceringTTSSettings

    def __init__(self, *, api_key: str, url: str, settings: VoiceringTTSSettings | None = None,
                 text_aggregation_mode: TextAggregationMode | None = None, open_timeout_s: float = 10.0,
                 reconnect_attempts: int = 6, reconnect_backoff_min_wait: float = 0.5,
                 reconnect_backoff_max_wait: float = 8.0, stop_frame_timeout_s: float = 30.0, **kwargs: Any) -> None:
        """Args:
            api_key: the tenant's API key (`voicering tenant key`).
            url: the gateway's base URL; the stream's path is added.
            settings: voice and options (`VoiceringTTSService.Settings`); ``voice`` is required.
            text_aggregation_mode: SENTENCE (default) flushes each sentence to the gateway as soon as
                Pipecat's aggregator completes it. TOKEN sends tokens as they come with
                `chunking: "auto"`: the worker speaks each sentence once it is complete (never cut
                inside "Dr.", a number or an address) and ends the context at the response's end.
            open_timeout_s: the websocket handshake's limit.
            reconnect_attempts: dials after a socket was lost or closed (a drain's 1001) before
                the service reports it cannot reach the gateway; back-off between them as Pipecat's
                (``reconnect_backoff_min_wait``, ``reconnect_backoff_max_wait``).
            stop_frame_timeout_s: how long Pipecat's playback waits for a context's next audio.
                The gateway ends every context with `done` or `error`, so this only guards a lost
                connection; 30 s is the gateway's own wait for a worker's first audio.
        """
        store = default_settings()
        if settings is not None:
            store.apply_update(settings)
        problem = check_settings(store)
        if problem:
            raise ValueError(problem)
        super().__init__(text_aggregation_mode=text_aggregation_mode, push_text_frames=False, push_start_frame=True,
                         pause_frame_processing=False, sample_rate=SAMPLE_RATE, settings=store,
                         stop_frame_timeout_s=stop_frame_timeout_s, reconnect_backoff_min_wait=reconnect_backoff_min_wait,
                         reconnect_backoff_max_wait=reconnect_backoff_max_wait, **kwargs)
        self._api_key = api_key
        self._url = stream_url(url)
        self._open_timeout_s = open_timeout_s
        self._reconnect_attempts = reconnect_attempts
        self._contexts: dict[str, _Context] = {}
        self._draining: dict[ClientConnection, asyncio.Task] = {}  # sockets left for a new one, read until closed
        self._dial = asyncio.Lock()
        self._receive_task: asyncio.Task | None = None
        self._opened_at = 0.0  # monotonic time the current socket opened
        self._drain_redials = 0  # dials since a drain closed a socket that had lived
        self.sockets_opened = 0

    def can_generate_metrics(self) -> bool:
        return True

    @property
    def open_sockets(self) -> int:
        """Websockets open now: the current one and any drained one still finishing its contexts."""
        current = self._websocket is not None and self._websocket.state is State.OPEN
        return int(current) + sum(ws.state is State.OPEN for ws in self._draining)

    # -- Pipecat's connection hooks ---------------------------------------------------------------

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        try:
            await self._connect_websocket()
        except VoiceringError as exc:  # the first turn dials again
            await self._push_voicering_error(exc)
        self._read()

    def _read(self) -> None:
        """Start Pipecat's receive loop on the current socket, unless it runs (one that gave up, its
        redials spent, has ended: a later turn's dial starts it again)."""
        if self._websocket is not None and (self._receive_task is None or self._receive_task.done()):
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        draining, self._draining = self._draining, {}
        for ws, reader in draining.items():
            await self.cancel_task(reader)
            await ws.close()
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        """Dial the gateway if no socket is open; raises `VoiceringError` when it cannot. Contexts
        waiting for a new socket are started on it."""
        async with self._dial:
            if self._websocket is None or self._websocket.state is not State.OPEN:
                self._websocket = None
                self._websocket = await self._open()
                self.sockets_opened += 1
                self._opened_at = time.monotonic()
                await self._call_event_handler("on_connected")
        for ctx in [c for c in self._contexts.values() if c.ws is None]:
            await self._replay(ctx)

    async def _open(self) -> ClientConnection:
        logger.debug(f"{self}: connecting to {self._url}")
        try:
            return await self._websocket_connect(self._url, additional_headers={"Authorization": f"Bearer {self._api_key}"},
                                                 open_timeout=self._open_timeout_s, max_size=MAX_MESSAGE_BYTES)
        except InvalidStatus as exc:
            raise from_status(self._url, exc.response.status_code, exc.response.body or b"") from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise VoiceringError("no_gateway", f"cannot reach the gateway at {self._url} ({type(exc).__name__})",
                                 True) from None

    async def _disconnect_websocket(self) -> None:
        ws, self._websocket = self._websocket, None
        try:
            await self.stop_all_metrics()
            if ws is not None:
                logger.debug(f"{self}: disconnecting from {self._url}")
                await ws.close()
        except Exception as exc:  # closing a socket that is already gone: nothing to report
            logger.debug(f"{self}: websocket close: {exc}")
        finally:
            if ws is not None and not self._disconnecting:  # replaced, not stopping: its turns go on elsewhere
                await self._socket_closed(ws, current=True)
            await self._call_event_handler("on_disconnected")

    async def _reconnect_websocket(self, attempt_number: int) -> bool:
        if self._websocket is not None and self._websocket.state is State.OPEN:  # a turn dialed meanwhile
            return await self._verify_connection()
        return await super()._reconnect_websocket(attempt_number)

    async def _try_reconnect(self, max_retries: int | None = None, report_error=None) -> bool:
        return await super()._try_reconnect(max_retries or self._reconnect_attempts, report_error)

    async def _close_connection_contexts(self) -> None:
        """Pipecat ends every audio context of a connection being replaced (a provider keeps no
        context across sockets). Those waiting to be replayed, and those still speaking on a
        drained socket, go on."""
        going_on = {c.id for c in self._contexts.values() if c.ws is None or c.ws in self._draining}
        for context_id in self.get_audio_contexts():
            if context_id not in going_on:
                self._contexts.pop(context_id, None)
                await self.remove_audio_context(context_id)
        if self._turn_context_id and self._turn_context_id not in going_on:
            self._turn_context_id = None
            self._turn_context_id = self.create_context_id()

    async def _update_settings(self, delta: VoiceringTTSSettings) -> dict[str, Any]:
        """A runtime update applies from the next turn; one the gateway would refuse is undone and
        reported (the service keeps speaking with what it had)."""
        changed = await super()._update_settings(delta)
        problem = check_settings(self._settings)
        if problem:
            for name, old in changed.items():
                setattr(self._settings, name, old)
            await self.push_error(f"voicering settings update refused: {problem}", category=ErrorCategory.APPLICATION)
            return {}
        return changed

    def _classify_error(self, exception: Exception) -> ErrorCategory | None:
        return exception.category if isinstance(exception, VoiceringError) else None

    # -- reading ----------------------------------------------------------------------------------

    async def _receive_messages(self) -> None:
        """Read the current socket. A drain's close (1001) is redialed here with back-off; any
        other close returns or raises to Pipecat's receive loop, which redials as it does for
        every service (its loop would end for good on websockets' `ConnectionClosedOK`)."""
        while True:
            ws = self._websocket
            if ws is None:
                raise ConnectionError(f"{self}: no websocket")
            try:
                raw = await ws.recv()
            except ConnectionClosed as closed:
                await self._socket_closed(ws, current=True)
                if closed.rcvd is not None and closed.rcvd.code == CloseCode.GOING_AWAY and not self._disconnecting:
                    await self._redial_after_drain(time.monotonic() - self._opened_at)
                    continue
                if isinstance(closed, ConnectionClosedOK):
                    return
                raise
            await self._receive(ws, raw)

    async def _redial_after_drain(self, lived_s: float) -> None:
        """The gateway closed the socket going away (1001): dial again with back-off until one
        answers. Not Pipecat's quick-failure rule: a drained gateway may still take a dial and close
        it at once (its listener closes a moment after it starts draining), which is a rollout,
        not bad credentials. A socket that lived past the longest back-off starts a new count."""
        if lived_s >= self._reconnect_backoff_max_wait:
            self._drain_redials = 0
        last: VoiceringError | None = None
        while self._drain_redials < self._reconnect_attempts:
            self._drain_redials += 1
            await asyncio.sleep(exponential_backoff_time(self._drain_redials, self._reconnect_backoff_min_wait,
                                                         self._reconnect_backoff_max_wait))
            try:
                await self._connect_websocket()
                return
            except VoiceringError as exc:
                if exc.category.is_permanent:
                    raise
                logger.warning(f"{self}: redial {self._drain_redials} after the gateway drained: {exc.message}")
                last = exc
        raise ConnectionError(f"{self}: no gateway answered at {self._url} after it drained "
                              f"({self._reconnect_attempts} dials): {last.message if last else 'closed again'}")

    async def _read_draining(self, ws: ClientConnection) -> None:
        """A drained socket's own reader: its contexts finish, then the gateway closes it (1001)."""
        try:
            async for raw in ws:
                await self._receive(ws, raw)
        except ConnectionClosed:
            pass
        self._draining.pop(ws, None)
        await self._socket_closed(ws, current=False)

    async def _receive(self, ws: ClientConnection, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            try:
                chunk = AudioChunk.decode(raw)
            except BadRequest as exc:
                logger.warning(f"{self}: unreadable audio frame from the gateway: {exc.message}")
                return
            await self._on_audio(chunk)
            return
        try:
            message = parse_server(raw)
        except (KeyError, TypeError, ValueError):  # a message type or shape this version does not know
            logger.debug(f"{self}: message not understood, skipped: {raw[:200]}")
            return
        if isinstance(message, Alignment):
            await self._on_words(message)
        elif isinstance(message, Done):
            await self._finish(message.context_id)
        elif isinstance(message, Error):
            await self._on_error(ws, message)
        elif isinstance(message, Rejected):
            await self._on_rejected(ws, message)

    async def _on_audio(self, chunk: AudioChunk) -> None:
        ctx = self._contexts.get(chunk.context_id)
        if ctx is not None:
            ctx.heard()
        if self.audio_context_available(chunk.context_id) or chunk.context_id == self._turn_context_id:
            await self.append_to_audio_context(chunk.context_id, TTSAudioRawFrame(
                chunk.pcm, SAMPLE_RATE, 1, context_id=chunk.context_id))
        elif ctx is not None:  # nobody plays it any more: stop the GPU work
            await self._cancel_context(ctx)

    async def _on_words(self, alignment: Alignment) -> None:
        if self.audio_context_available(alignment.context_id):
            await self.add_word_timestamps([(w.text, w.start_s) for w in alignment.words], alignment.context_id)

    async def _on_error(self, ws: ClientConnection, error: Error) -> None:
        ctx = self._contexts.get(error.context_id) if error.context_id else None
        if error.code == "going_away" and ctx is not None and ctx.ws is ws and ctx.sent is not None:
            ctx.ws = None  # never opened there: it waits for the next socket
            await self._leave(ws)  # the new socket replays the contexts waiting for it
            if ctx.ws is None:
                await self._replay(ctx)
            return
        failure = VoiceringError(error.code, error.message, error.retryable, error.context_id)
        if error.context_id is None:
            await self._push_voicering_error(failure)
        else:
            await self._finish(error.context_id, failure)

    async def _on_rejected(self, ws: ClientConnection, rejected: Rejected) -> None:
        """One message had no effect. Text the gateway refused is text the listener will not hear;
        refusals of a context this service already left (a cancel after its end, messages a
        drained gateway refused before the replay) change nothing."""
        ctx = self._contexts.get(rejected.context_id) if rejected.context_id else None
        if ctx is None or ctx.ws is not ws:
            logger.debug(f"{self}: gateway refused a {rejected.message_type} message: {rejected.code}")
            return
        await self._push_voicering_error(VoiceringError(rejected.code, rejected.message, rejected.retryable,
                                                        rejected.context_id))

    # -- a context's life -------------------------------------------------------------------------

    @traced_tts
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send one sentence of the turn `context_id` (the first opens its gateway context); its
        audio comes through the receive loop."""
        try:
            ctx = self._contexts.get(context_id)
            if ctx is None:
                ctx = await self._open_context(context_id, text)
            else:
                await self._send(ctx, encode(PushText(context_id, text)))
            if not self._is_streaming_tokens:
                await self._send(ctx, encode(Flush(context_id)))
            await self.start_tts_usage_metrics(text)
        except VoiceringError as exc:
            await self._finish(context_id, exc)
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn has no more text: `end` its context (the gateway speaks what is left, then `done`)."""
        ctx = self._contexts.get(context_id or self.get_active_audio_context_id() or "")
        if ctx is None:
            return
        try:
            await self._send(ctx, encode(End(ctx.id)))
        except VoiceringError as exc:
            await self._finish(ctx.id, exc)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """The pipeline was interrupted: cancel the context on the gateway now, so the worker stops."""
        await self.stop_all_metrics()
        ctx = self._contexts.get(context_id)
        if ctx is not None:
            await self._cancel_context(ctx)
        await super().on_audio_context_interrupted(context_id)

    async def on_audio_context_completed(self, context_id: str) -> None:
        """Playback is done with the context. One still open on the gateway then (Pipecat gave up
        waiting for its audio, and not the turn being written) will never be played: cancel it."""
        ctx = self._contexts.get(context_id)
        if ctx is not None and context_id != self._turn_context_id:
            await self._cancel_context(ctx)
        await super().on_audio_context_completed(context_id)

    async def _open_context(self, context_id: str, text: str) -> _Context:
        if self._websocket is None or self._websocket.state is not State.OPEN:
            await self._connect_websocket()  # raises why not
            self._read()
        ctx = self._contexts[context_id] = _Context(context_id, self._websocket)
        await self._send(ctx, start_message(context_id, text, self._settings, auto_chunking=self._is_streaming_tokens))
        ctx.started_at = time.perf_counter()
        return ctx

    async def _send(self, ctx: _Context, message: str) -> None:
        """One message of `ctx`, kept for a replay until its first audio. A context whose socket is
        lost before its audio waits for the next socket instead (a replay sends it then)."""
        async with ctx.sending:
            ctx.keep(message)
            if ctx.ws is None:
                if ctx.sent is None:
                    raise VoiceringError("connection_lost", "the gateway connection dropped and this turn held more "
                                         "text than can be replayed", True, ctx.id)
                return
            try:
                await ctx.ws.send(message)
            except ConnectionClosed:
                if ctx.sent is None:
                    raise VoiceringError("connection_lost", "the gateway connection dropped while this turn was "
                                         "speaking", True, ctx.id) from None
                ctx.ws = None

    async def _cancel_context(self, ctx: _Context) -> None:
        self._contexts.pop(ctx.id, None)
        async with ctx.sending:  # after a replay in progress, on the socket it was replayed on
            if ctx.ws is None:
                return
            try:
                await ctx.ws.send(encode(Cancel(ctx.id)))
            except ConnectionClosed:
                pass  # the gateway cancels every context of a connection that goes

    async def _replay(self, ctx: _Context) -> None:
        """Start `ctx` again on the current socket with the messages it sent, none of its audio heard."""
        async with ctx.sending:
            ws = self._websocket
            if ws is None or ctx.ws is not None or not ctx.sent or self._contexts.get(ctx.id) is not ctx:
                return  # no socket yet, replayed already, or cancelled meanwhile
            logger.info(f"{self}: starting context {ctx.id} again on a new connection ({len(ctx.sent)} messages)")
            try:
                for message in list(ctx.sent):
                    await ws.send(message)
            except ConnectionClosed:
                return  # the next socket tries again
            ctx.ws = ws

    async def _leave(self, ws: ClientConnection) -> None:
        """The gateway behind `ws` is draining: new contexts go to a new socket now, and `ws` is read
        until it closes, so its own contexts finish."""
        if ws is not self._websocket:
            return
        self._draining[ws] = self.create_task(self._read_draining(ws), name="voicering-draining-socket")
        async with self._dial:
            self._websocket = None
        await self._connect_websocket()

    async def _socket_closed(self, ws: ClientConnection, *, current: bool) -> None:
        """`ws` closed: its contexts not yet heard wait for the next socket; those cut while
        speaking end with `connection_lost` (what was heard is never replayed)."""
        code = ws.close_code
        for ctx in [c for c in self._contexts.values() if c.ws is ws]:
            if ctx.sent is not None:
                ctx.ws = None
                continue
            await self._finish(ctx.id, VoiceringError("connection_lost", f"the gateway closed the connection ({code}) "
                                                      "while this turn was speaking", True, ctx.id))
        if not current and self._websocket is not None:
            for ctx in [c for c in self._contexts.values() if c.ws is None]:
                await self._replay(ctx)

    async def _finish(self, context_id: str, error: VoiceringError | None = None) -> None:
        """The gateway ended the context (`done`, or `error`): its audio context ends after the
        audio it had; the error goes upstream as an ErrorFrame."""
        self._contexts.pop(context_id, None)
        if error is not None:
            await self._push_voicering_error(error)
        if self.audio_context_available(context_id):
            if error is not None:
                await self.cancel_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _push_voicering_error(self, error: VoiceringError) -> None:
        await self.push_error(str(error), exception=error, category=error.category)
