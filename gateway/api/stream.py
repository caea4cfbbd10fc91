"""`/v1/tts/stream`: the worker protocol's contexts over a websocket, for apps that stream text
(LLM output, game dialogue) and want audio back as it is spoken.

The messages are the worker's own (docs/protocol.md): `start` (with the tenant's voice name),
`text`, `flush`, `end`, `cancel`; binary audio frames tagged with the caller's context id; `done`,
`error`, `rejected`. The gateway adds what only it knows: the API key (`Authorization: Bearer`
on the handshake; a bad key is refused with HTTP 401 before the upgrade), tenant voice names,
one of the tenant's stream slots per open context (`error` code `streams_limit_exceeded` when the
tenant is at its limit), routing through the pool (another worker takes the context until its
first audio), usage metering. Text limits are the workers' (one place, one code).

Writes go through one bounded outbox and one writer task: a client that stops reading for
`SLOW_CONSUMER_S` is cut (1008), its contexts cancelled on the workers. A disconnect cancels
every open context at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from gateway.api.auth import authenticate, gateway_of, resolve_and_admit
from gateway.api.errors import ApiError
from gateway.api.state import Gateway
from gateway.quotas import StreamSlot
from gateway.tenants import Tenant, TenantError
from gpu_worker.client import WorkerRequestError
from gpu_worker.errors import BadMessage
from gpu_worker.pool import PoolStream
from gpu_worker.protocol import (AudioChunk, Cancel, Done, End, Error, Flush, PushText, Rejected, Start, encode,
                                 parse_client)

__all__ = ["router"]

log = logging.getLogger(__name__)

OUTBOX = 256  # messages queued for one connection's writer
SLOW_CONSUMER_S = 5.0  # a message that cannot be queued this long cuts the connection
BYTES_PER_SECOND = 48000

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
    await _Session(gateway, tenant, ws).run()


class _Cut(Exception):
    """The client stopped reading: the connection is closed."""


@dataclass(eq=False)
class _Context:
    id: str
    stream: PoolStream | None = None
    slot: StreamSlot | None = None
    relay: asyncio.Task | None = None
    pcm_bytes: int = 0
    ended: bool = False  # `end` was sent: text after it is refused
    opening: asyncio.Event = field(default_factory=asyncio.Event)


class _Session:
    """One websocket: its contexts, its outbox and writer, and their cleanup."""

    def __init__(self, gateway: Gateway, tenant: Tenant, ws: WebSocket) -> None:
        self.gateway, self.tenant, self.ws = gateway, tenant, ws
        self.contexts: dict[str, _Context] = {}
        self.outbox: asyncio.Queue[str | bytes | None] = asyncio.Queue(OUTBOX)
        self.cut = asyncio.Event()

    async def run(self) -> None:
        writer = asyncio.create_task(self._write(), name="tts-stream-writer")
        reader = asyncio.create_task(self._read(), name="tts-stream-reader")
        cut = asyncio.create_task(self.cut.wait(), name="tts-stream-cut")
        try:
            await asyncio.wait({writer, reader, cut}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reader.cancel()
            cut.cancel()
            contexts = list(self.contexts.values())
            for ctx in contexts:
                if ctx.relay is not None:
                    ctx.relay.cancel()
            await asyncio.gather(reader, cut, *(c.relay for c in contexts if c.relay), return_exceptions=True)
            if self.outbox.full() or self.cut.is_set():
                writer.cancel()
            else:
                self.outbox.put_nowait(None)  # the writer sends what is queued, then stops
            await asyncio.gather(writer, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.ws.close(1008 if self.cut.is_set() else 1000)

    # -- the two tasks ----------------------------------------------------------------------------

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
            if raw["type"] == "websocket.disconnect":
                return
            data = raw.get("text") if raw.get("text") is not None else raw.get("bytes")
            try:
                message = parse_client(data)
            except BadMessage as exc:
                await self._send(encode(Rejected("bad_request", exc.message, False, exc.context_id, exc.message_type)))
                continue
            await self._handle(message)

    # -- messages ---------------------------------------------------------------------------------

    async def _handle(self, message) -> None:
        ctx = self.contexts.get(message.context_id)
        if isinstance(message, Start):
            if ctx is not None:
                await self._refuse(message, "a context with this id is open; pick a new context_id")
                return
            ctx = self.contexts[message.context_id] = _Context(message.context_id)
            ctx.relay = asyncio.create_task(self._speak(ctx, message), name=f"tts-stream-context:{ctx.id}")
            return
        if ctx is None:
            await self._refuse(message, "no open context has this id (it ended, or was never started)")
            return
        if isinstance(message, PushText | Flush | End) and ctx.ended:
            await self._refuse(message, "this context was ended; start a new one to say more")
            return
        if isinstance(message, End):
            ctx.ended = True
        await ctx.opening.wait()  # the worker's context exists (or the context already failed)
        stream = ctx.stream
        if stream is None:
            return  # it ended with an error already sent
        with contextlib.suppress(WorkerRequestError):
            if isinstance(message, PushText):
                await stream.push(message.text)
            elif isinstance(message, Flush):
                await stream.flush()
            elif isinstance(message, End):
                await stream.end()
            elif isinstance(message, Cancel):
                await stream.cancel()

    async def _speak(self, ctx: _Context, start: Start) -> None:
        gateway, tenant = self.gateway, self.tenant
        began = time.perf_counter()
        try:
            try:
                voice_id, ctx.slot = await resolve_and_admit(gateway, tenant, start.voice)
                ctx.stream = await gateway.pool.start(voice_id, start.text, options=start.options)
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

    async def _relay(self, ctx: _Context, began: float) -> None:
        stream = ctx.stream
        assert stream is not None
        seq = 0
        try:
            async for pcm in stream.audio():
                if seq == 0:
                    self.gateway.metrics.ttfb.labels("stream", "pcm").observe(time.perf_counter() - began)
                ctx.pcm_bytes += len(pcm)
                await self._send(AudioChunk(ctx.id, seq, pcm).encode())
                seq += 1
        except WorkerRequestError as exc:
            await self._error(ctx, exc.error.code, exc.error.message, exc.retryable)
            return
        done = stream.done
        if done is not None:
            await self._send(encode(Done(ctx.id, done.stats, done.reason)))

    async def _close(self, ctx: _Context) -> None:
        """The context is over (done, error, or the connection went): free all it held, once."""
        if self.contexts.get(ctx.id) is ctx:
            del self.contexts[ctx.id]
        stream = ctx.stream
        if stream is not None and stream.done is None:
            with contextlib.suppress(Exception):
                await asyncio.shield(stream.cancel())
        if ctx.slot is not None:
            await ctx.slot.__aexit__(None, None, None)
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
            await asyncio.wait_for(self.outbox.put(item), SLOW_CONSUMER_S)
        except TimeoutError:
            log.warning("tenant %s stopped reading its stream for %.0f s; closing it", self.tenant.id, SLOW_CONSUMER_S)
            self.cut.set()
            raise _Cut() from None

    async def _error(self, ctx: _Context, code: str, message: str, retryable: bool) -> None:
        await self._send(encode(Error(code, message, retryable, ctx.id)))

    async def _refuse(self, message, why: str) -> None:
        await self._send(encode(Rejected("bad_request", why, False, message.context_id, message.type)))
