"""`/v1/tts/stream`: the worker protocol's contexts over a websocket, for apps that stream text
(LLM output, game dialogue) and want audio back as it is spoken.

The messages are the worker's own (docs/protocol.md): `start` (with the tenant's voice name),
`text`, `flush`, `end`, `cancel`; binary audio frames tagged with the caller's context id; `done`,
`error`, `rejected`. The gateway adds what only it knows: the API key (`Authorization: Bearer`
on the handshake; a bad key is refused with HTTP 401 before the upgrade), tenant voice names,
the tenant's pronunciation dictionaries (a `start`'s `pronunciations` names, resolved to the
references the worker reads them by; `options.pronunciations` from a caller is refused),
one of the tenant's stream slots per open context (`error` code `streams_limit_exceeded` when the
tenant is at its limit), routing through the pool (another worker takes the context until its
first audio), usage metering (a context is metered once a worker opened it; one refused before
is not).

**Every byte is bounded before it is buffered or forwarded.** uvicorn refuses a websocket message
over `WS_MAX_MESSAGE_BYTES` (gateway/serve.py: the largest legal message, a `start` holding
`MAX_TEXT_CHARS` characters each escaped as a 12-byte surrogate pair, plus voice and options)
by closing this socket with 1009. A context is held to the worker's own text limits
(gpu_worker.protocol) before anything reaches the shared link to a worker: a `start` over
`MAX_TEXT_CHARS` ends with `error` `text_too_long`; a `text` that would buffer more than
`MAX_TEXT_CHARS` before a flush is `rejected` (`text_too_long`); until its first audio (while
the pool keeps every message for a replay on another worker) a context may send at most
`MAX_CONTEXT_BACKLOG_CHARS` characters, each message counting at least one, else `rejected`
(`backlog_full`). The pool measures each message's encoded bytes against the worker's message
limit and refuses it unsent (`text_too_long`). A worker's own `rejected` of a message is relayed.

**The key is re-checked while the socket is open**, every half `auth_cache_s` (at least
`MIN_KEY_CHECK_S`): a revoked key gets `error` `invalid_api_key` (no context id) and the socket is
closed with 1008, its contexts cancelled; changed limits apply to the contexts started after
the check. Each `start` is counted against the tenant's rate limit as an HTTP request is
(`error` `requests_limit_exceeded` for that context past it); the handshake counts one too.

**Each context is a request of its own to trace**: a child span of its `start`'s `traceparent`
(refused with `bad_request` when malformed, like any field), else a new trace; its `done.stats`
carry the `trace_id`, and the gateway logs one `hop=gateway` line when it ends.

**What the gateway adds to first audio, on its own clock** (HTTP's `Server-Timing` for the
socket): `done.stats.gateway_ms` is the `start`'s arrival to the worker start (key, request window,
voice name, stream slot: `admit`) plus the first audio's arrival from the worker (its link's reader
took it off the socket) to its hand-off to this socket's writer. The time in between is the
worker's (and the link's); nothing of the client's network is in it.

Writes go through one bounded outbox and one writer task: a client that stops reading for
`SLOW_CONSUMER_S` is cut (1008), its contexts cancelled on the workers. A disconnect cancels
every open context at once.

**A stopping gateway drains** (gateway/api/drain.py): a `start` gets `error` `going_away`
(retryable: reconnect, another gateway takes it), open contexts run to their end, and the socket
closes with 1001 once its last one has ended, or at the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field, replace

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from gateway.api.auth import authenticate, bearer_key, count_request, gateway_of, identify, resolve_speech
from gateway.api.drain import GOING_AWAY
from gateway.api.errors import ApiError
from gateway.api.state import Gateway
from gateway.quotas import StreamSlot
from gateway.tenants import Tenant, TenantError
from gpu_worker.client import PoolStream, WorkerRequestError
from gpu_worker.errors import BadMessage
from gpu_worker.protocol import (MAX_CONTEXT_BACKLOG_CHARS, MAX_TEXT_CHARS, Alignment, AudioChunk, Cancel, ClientMessage,
                                 Done, End, Error, Flush, PushText, Rejected, Start, encode, parse_client)
from gpu_worker.trace_context import Hop, TraceContext, current, log_hop, parse

__all__ = ["router"]

log = logging.getLogger(__name__)

OUTBOX = 256  # messages queued for one connection's writer
SLOW_CONSUMER_S = 5.0  # a message that cannot be queued this long cuts the connection
BYTES_PER_SECOND = 48000
MIN_KEY_CHECK_S = 0.5  # the key of an open socket is checked at most this often, whatever auth_cache_s says
POLICY_VIOLATION = 1008  # close code: cut as a slow consumer, or its key was revoked

router = APIRouter()


@router.websocket("/v1/tts/stream")
async def tts_stream(ws: WebSocket) -> None:
    gateway = gateway_of(ws)
    try:
        tenant = await authenticate(gateway, ws.headers)
    except ApiError as exc:
        gateway.metrics.requests.labels("/v1/tts/stream", str(exc.status)).inc()
        await ws.send_denial_response(exc.response())
        return
    await ws.accept()
    gateway.metrics.requests.labels("/v1/tts/stream", "101").inc()
    await _Session(gateway, tenant, bearer_key(ws.headers), ws).run()


class _Cut(Exception):
    """The client stopped reading: the connection is closed."""


@dataclass(eq=False)
class _Slot:
    id: str
    stream: PoolStream | None = None
    slot: StreamSlot | None = None
    relay: asyncio.Task | None = None
    pcm_bytes: int = 0
    ended: bool = False  # `end` was sent: text after it is refused
    opening: asyncio.Event = field(default_factory=asyncio.Event)
    buffered_chars: int = 0  # sent since the last flush (the worker buffers them as one segment)
    held_before_audio: int = 0  # characters (at least one per message) sent before the first audio
    rejections_relayed: int = 0  # of the worker's `rejected` for this context
    trace: TraceContext = field(default_factory=TraceContext.new)  # the gateway's span of this context
    voice: str = ""  # the voice id sent to the workers
    began: float = field(default_factory=time.perf_counter)
    began_unix: float = field(default_factory=time.time)
    first_audio_at: float | None = None
    admitted_at: float | None = None  # key, window, voice and slot done: the worker start is sent next
    gateway_ms: float | None = None  # the gateway's own share of the first audio (module docstring)
    outcome: str = "cancelled"  # until its done or error

    def admit(self, message: ClientMessage) -> Rejected | None:
        """Count `message` against this context's text limits, or say why it is refused (and not counted)."""
        chars = len(message.text) if isinstance(message, PushText) else 0
        if chars and self.buffered_chars + chars > MAX_TEXT_CHARS:
            return Rejected("text_too_long", f"text exceeds {MAX_TEXT_CHARS} characters before a flush; flush (or end) "
                                             "at least every few sentences", False, self.id, message.type)
        before_audio = self.stream is None or self.stream.first_audio_at is None
        if before_audio and not isinstance(message, Cancel):
            held = self.held_before_audio + max(1, chars)
            if held > MAX_CONTEXT_BACKLOG_CHARS:
                return Rejected("backlog_full", f"context '{self.id}' sent {self.held_before_audio} characters and "
                                                f"messages before its first audio (limit {MAX_CONTEXT_BACKLOG_CHARS}); "
                                                "wait for its audio before sending more", False, self.id, message.type)
            self.held_before_audio = held
        self.buffered_chars = 0 if isinstance(message, Flush | End) else self.buffered_chars + chars
        return None


class _Session:
    """One websocket: its contexts, its outbox and writer, and their cleanup."""

    def __init__(self, gateway: Gateway, tenant: Tenant, key: str | None, ws: WebSocket) -> None:
        self.gateway, self.tenant, self.ws = gateway, tenant, ws
        self.key = key
        self.contexts: dict[str, _Slot] = {}
        self.outbox: asyncio.Queue[str | bytes | None] = asyncio.Queue(OUTBOX)
        self.cut = asyncio.Event()
        self.leave = asyncio.Event()  # the gateway's drain is over: close now (go_away)
        self.close_code = 1000

    def go_away(self) -> None:
        self.leave.set()

    async def run(self) -> None:
        drain = self.gateway.streams
        drain.join(self)
        writer = asyncio.create_task(self._write(), name="tts-stream-writer")
        reader = asyncio.create_task(self._read(), name="tts-stream-reader")
        cut = asyncio.create_task(self.cut.wait(), name="tts-stream-cut")
        keycheck = asyncio.create_task(self._check_key(), name="tts-stream-key")
        drained = asyncio.create_task(self._until_drained(), name="tts-stream-drained")
        try:
            await asyncio.wait({writer, reader, cut, keycheck, drained}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drain.leave(self)
            for task in (reader, cut, keycheck, drained):
                task.cancel()
            contexts = list(self.contexts.values())
            for ctx in contexts:
                if ctx.relay is not None:
                    ctx.relay.cancel()
            await asyncio.gather(reader, cut, keycheck, drained, *(c.relay for c in contexts if c.relay),
                                 return_exceptions=True)
            if self.outbox.full() or self.cut.is_set():
                writer.cancel()
            else:
                self.outbox.put_nowait(None)  # the writer sends what is queued, then stops
            await asyncio.gather(writer, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.ws.close(POLICY_VIOLATION if self.cut.is_set() else self.close_code)

    # -- the tasks --------------------------------------------------------------------------------

    async def _check_key(self) -> None:
        """Look the key up again every interval, so revocation and new limits reach this socket
        within `auth_cache_s`; returns (ending the session) once the key no longer opens a tenant."""
        interval = max(MIN_KEY_CHECK_S, self.gateway.settings.auth_cache_s / 2)
        while True:
            await asyncio.sleep(interval)
            try:
                self.tenant = await identify(self.gateway, self.key)
            except ApiError as exc:
                if exc.status != 401:  # Redis away and the key not cached: keep serving, as for a live stream
                    log.warning("key of tenant %s not re-checked: %s", self.tenant.id, exc.message)
                    continue
                log.info("tenant %s: its key stopped working; closing its stream socket", self.tenant.id)
                self.close_code = POLICY_VIOLATION
                with contextlib.suppress(_Cut):
                    await self._send(encode(Error(exc.code or "invalid_api_key", "this API key was revoked or "
                                                  "deleted; the stream is closed and its contexts cancelled",
                                                  False)))
                return

    async def _until_drained(self) -> None:
        """Returns (ending the session with 1001) once the gateway is stopping and this socket's
        last context has ended, or when the drain's grace is over (`go_away`)."""
        await self.gateway.streams.stopping.wait()
        if self.close_code == 1000:
            self.close_code = GOING_AWAY
        while self.contexts and not self.leave.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self.leave.wait()

    async def _write(self) -> None:
        try:
            while (item := await self.outbox.get()) is not None:
                if isinstance(item, bytes):
                    await self.ws.send_bytes(item)
                else:
                    await self.ws.send_text(item)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def _read(self) -> None:
        while True:
            try:
                raw = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            arrived = time.perf_counter()
            if raw["type"] == "websocket.disconnect":
                return
            data = raw.get("text") if raw.get("text") is not None else raw.get("bytes")
            try:
                message = parse_client(data)
            except BadMessage as exc:
                await self._send(encode(Rejected("bad_request", exc.message, False, exc.context_id, exc.message_type)))
                continue
            await self._handle(message, arrived)

    # -- messages ---------------------------------------------------------------------------------

    async def _handle(self, message: ClientMessage, arrived: float) -> None:
        ctx = self.contexts.get(message.context_id)
        if isinstance(message, Start):
            if ctx is not None:
                await self._refuse(message, "a context with this id is open; pick a new context_id")
                return
            if self.gateway.streams.stopping.is_set():  # never opened: nothing counted or forwarded
                await self._send(encode(Error("going_away", "this gateway is stopping: open a new connection and "
                                              "start the context there (another gateway takes it)", True,
                                              message.context_id)))
                return
            if len(message.text) > MAX_TEXT_CHARS:  # it never opens: nothing is counted, held or forwarded
                await self._send(encode(Error("text_too_long", f"'text' of a start is {len(message.text)} characters, "
                                              f"over the {MAX_TEXT_CHARS} a context may buffer before a flush; start "
                                              "with less and send the rest as 'text' messages with flushes", False,
                                              message.context_id)))
                return
            if message.options.pronunciations is not None:  # references are the gateway's to make: never a caller's
                await self._send(encode(Error("bad_request", "'options.pronunciations' is not for callers: name your "
                                              "pronunciation dictionaries in the start's 'pronunciations' "
                                              '(["medical", ...])', False, message.context_id)))
                return
            caller = parse(message.traceparent) if message.traceparent else None  # parse_client checked it
            ctx = self.contexts[message.context_id] = _Slot(message.context_id, began=arrived)
            if caller is not None:
                ctx.trace = caller.child()
            ctx.admit(PushText(ctx.id, message.text))
            ctx.relay = asyncio.create_task(self._speak(ctx, message), name=f"tts-stream-context:{ctx.id}")
            return
        if ctx is None:
            await self._refuse(message, "no open context has this id (it ended, or was never started)")
            return
        if isinstance(message, PushText | Flush | End) and ctx.ended:
            await self._refuse(message, "this context was ended; start a new one to say more")
            return
        refused = ctx.admit(message)
        if refused is not None:
            await self._send(encode(refused))
            return
        if isinstance(message, End):
            ctx.ended = True
        await ctx.opening.wait()  # the worker's context exists (or the context already failed)
        stream = ctx.stream
        if stream is None:
            return  # it ended with an error already sent
        try:
            if isinstance(message, PushText):
                await stream.push(message.text)
            elif isinstance(message, Flush):
                await stream.flush()
            elif isinstance(message, End):
                await stream.end()
            elif isinstance(message, Cancel):
                await stream.cancel()
        except WorkerRequestError as exc:  # the pool refused it unsent (a worker would not take it): no effect
            await self._send(encode(Rejected(exc.error.code, exc.error.message, False, ctx.id, message.type)))

    async def _speak(self, ctx: _Slot, start: Start) -> None:
        gateway, tenant = self.gateway, self.tenant
        began = ctx.began
        current.set(ctx.trace)  # this context's task: its log records carry the trace id
        try:
            try:
                await count_request(gateway, tenant)
                voice_id, ctx.slot, refs = await resolve_speech(gateway, tenant, start.voice, start.pronunciations)
                ctx.voice = voice_id
                ctx.admitted_at = time.perf_counter()
                options = replace(start.options, pronunciations=refs) if refs else start.options
                ctx.stream = await gateway.pool.start(voice_id, start.text, options=options,
                                                      traceparent=ctx.trace.traceparent)
            except ApiError as exc:
                await self._error(ctx, exc.code or "error", exc.message, exc.retry_after_s is not None)
                return
            except WorkerRequestError as exc:
                await self._error(ctx, exc.error.code, exc.error.message, exc.retryable)
                return
            finally:
                ctx.opening.set()
            gateway.metrics.active_streams.labels(tenant.name).inc()
            try:
                await self._relay(ctx, began)
            finally:
                gateway.metrics.active_streams.labels(tenant.name).dec()
        finally:
            await self._close(ctx)

    async def _relay(self, ctx: _Slot, began: float) -> None:
        stream = ctx.stream
        assert stream is not None
        seq = 0
        try:
            async for pcm in stream.events():
                if isinstance(pcm, Alignment):  # word timings the caller asked for, after their audio
                    await self._send(encode(replace(pcm, context_id=ctx.id)))
                    continue
                if seq == 0:
                    ctx.first_audio_at = time.perf_counter()
                    self.gateway.metrics.ttfb.labels("stream", "pcm").observe(ctx.first_audio_at - began)
                await self._relay_rejections(ctx)
                ctx.pcm_bytes += len(pcm)
                await self._send(AudioChunk(ctx.id, seq, pcm).encode())
                if seq == 0:
                    ctx.gateway_ms = _gateway_share_ms(ctx, stream.last_chunk_received_at)
                seq += 1
        except WorkerRequestError as exc:
            await self._relay_rejections(ctx)
            await self._error(ctx, exc.error.code, exc.error.message, exc.retryable)
            return
        await self._relay_rejections(ctx)
        done = stream.done
        if done is not None:
            ctx.outcome = done.reason
            await self._send(_done_message(ctx, done))

    async def _relay_rejections(self, ctx: _Slot) -> None:
        """The worker's `rejected` of this context's messages (they had no effect), as the caller named it."""
        stream = ctx.stream
        assert stream is not None
        for r in stream.rejected[ctx.rejections_relayed:]:
            await self._send(encode(Rejected(r.code, r.message, r.retryable, ctx.id, r.message_type)))
        ctx.rejections_relayed = len(stream.rejected)

    async def _close(self, ctx: _Slot) -> None:
        """The context is over (done, error, or the connection went): free all it held, once. It is
        metered only if a worker opened it (the rule of the HTTP routes too)."""
        if self.contexts.get(ctx.id) is ctx:
            del self.contexts[ctx.id]
        stream = ctx.stream
        _log_hop(ctx)
        try:
            if stream is not None and stream.done is None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(stream.cancel())
        finally:
            if ctx.slot is not None:
                await ctx.slot.__aexit__(None, None, None)
        if stream is None:
            return
        seconds = ctx.pcm_bytes / BYTES_PER_SECOND
        self.gateway.metrics.audio_seconds.labels(self.tenant.name).inc(seconds)
        try:
            await self.gateway.meter.add_usage(self.tenant, audio_seconds=seconds, requests=1)
        except TenantError as exc:
            log.warning("usage of tenant %s not recorded (%.2f s): %s", self.tenant.id, seconds, exc.message)

    # -- output -----------------------------------------------------------------------------------

    async def _send(self, item: str | bytes) -> None:
        if self.cut.is_set():
            raise _Cut()
        try:
            async with asyncio.timeout(SLOW_CONSUMER_S):  # not wait_for: 3.11's drops a cancel that lands with the put
                await self.outbox.put(item)
        except TimeoutError:
            log.warning("tenant %s stopped reading its stream for %.0f s; closing it", self.tenant.id, SLOW_CONSUMER_S)
            self.cut.set()
            raise _Cut() from None

    async def _error(self, ctx: _Slot, code: str, message: str, retryable: bool) -> None:
        ctx.outcome = code
        await self._send(encode(Error(code, message, retryable, ctx.id)))

    async def _refuse(self, message, why: str) -> None:
        await self._send(encode(Rejected("bad_request", why, False, message.context_id, message.type)))


def _gateway_share_ms(ctx: _Slot, received_from_worker: float | None) -> float | None:
    """The gateway's own share of a context's first audio, once it was handed to the writer: admit
    (the start's arrival -> the worker start) + relay (the first audio off the worker's link ->
    handed to this socket's writer)."""
    if ctx.admitted_at is None or received_from_worker is None:
        return None
    return ((ctx.admitted_at - ctx.began) + (time.perf_counter() - received_from_worker)) * 1000


def _done_message(ctx: _Slot, done: Done) -> str:
    """The worker's `done` as the caller named the context, its stats with the gateway's own
    `gateway_ms` (absent when no audio came)."""
    message = encode(Done(ctx.id, done.stats, done.reason))
    if ctx.gateway_ms is None:
        return message
    payload = json.loads(message)
    payload["stats"]["gateway_ms"] = round(ctx.gateway_ms, 3)
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def _log_hop(ctx: _Slot) -> None:
    stream = ctx.stream
    log_hop(log, Hop.ended("gateway", ctx.trace, worker="", to=(stream.worker_id or "") if stream else "",
                           voice=ctx.voice, context=stream.context_id if stream else "", received=ctx.began,
                           received_unix=ctx.began_unix, first_audio=ctx.first_audio_at, outcome=ctx.outcome))
