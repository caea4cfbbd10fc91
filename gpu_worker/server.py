"""The worker's websocket server: one connection, many contexts, audio back as tagged binary frames.

Each connection runs three named tasks under its handler: a reader (client messages -> contexts),
a writer draining a bounded outbox, and one task per context. Every message gets an answer and
no message, however malformed, costs the connection or its other contexts:

- a refused message is answered `rejected` (nothing else changed; a context it names carries on);
- an `error` with a context id means that context is over (its task cancelled, its slot freed):
  a refused `start`, a context-ending limit (`text_too_long`, `backlog_full`, `empty_text`), a
  voice or engine failure, an idle context.

Back-pressure:

- **admission** (`gpu_worker.admission`): past ``max_streams`` concurrent contexts on the worker,
  the connection's share of them, the relay bound, or (for a start a ring-aware pool placed) the
  worker's share of the fleet's load, a `start` gets a retryable ``busy`` at once, naming the limit.
- **the reader never waits on a context's work**: a cancel or a context-ending limit cancels the
  context's task and returns; the context's one answer (`done` cancelled, or its `error`) is sent
  by a closer task once the context's work has stopped, after any audio it had queued.
- **slow consumers**: a message that cannot be queued, or written to the socket, within
  ``slow_consumer_s`` (the client stopped reading and the kernel's buffers are full) cuts the whole
  connection: its contexts are cancelled (aborting their engine requests), the socket is closed
  with 1008 "slow consumer" (or aborted if even that cannot be written), a log line and the
  ``slow_consumer`` metric record it, and no other connection waits on it.

Protocol version 2 (`PROTOCOL_HEADER` on the handshake; every handshake is answered with it): such
a connection also gets `opened` for each admitted start and the worker's ``load`` on `done`/`error`;
a version-1 connection gets exactly the version-1 messages.

The admission bounds and the worker's counts are `gpu_worker.admission`; the HTTP routes on the
same port (/health, /metrics, /prewarm) are `gpu_worker.side_routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field, replace
from http import HTTPStatus

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gpu_worker.admission import Admission, Holds
from gpu_worker.errors import BacklogFull, BadMessage, BadRequest, EmptyText, SlowConsumer, TextTooLong, WorkerError
from gpu_worker.context import Backlog, Context, ContextDeps, Send
from gpu_worker.protocol import (CONNECTION_STREAMS_HEADER, MAX_MESSAGE_BYTES, PROTOCOL_HEADER, PROTOCOL_VERSION, AudioChunk,
                                 Cancel, ClientMessage, ContextStats, Done, End, Error, Flush, Opened, PushText, Rejected,
                                 Start, encode, parse_client, protocol_version)
from gpu_worker.proxy import Forwarder, RelayedContext
from gpu_worker.settings import WorkerSettings
from gpu_worker.side_routes import SideRoutes
from hashring.errors import InvalidVoiceId
from hashring.placement import HeatRecorder

log = logging.getLogger(__name__)

SLOW_CONSUMER_CLOSE = 1008
INTERNAL_ERROR_CLOSE = 1011
_ENDS_CONTEXT = (TextTooLong, BacklogFull, EmptyText)  # limits that end the context they were hit on


@dataclass(slots=True)
class _Slot:
    """A context's place on its connection: the `Context` that speaks it, its task, the worker count
    it holds (a relay that falls back to this engine moves to ``engine``), and whether the reader
    has ended it (its one answer then comes from a closer task, once its work has stopped)."""

    context_id: str
    holds: Holds
    context: Context | None = None  # set as soon as it is built (it needs this context's send)
    task: asyncio.Task | None = None
    ending: bool = False
    closer: asyncio.Task | None = None  # sends its answer once the reader ended it and its work stopped

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


@dataclass(slots=True)
class _Connection:
    """Per-connection state, owned by one handler call."""

    ws: ServerConnection
    outbox: asyncio.Queue
    slow_consumer_s: float
    backlog: Backlog
    version: int = 1  # the protocol version its handshake asked for (`protocol_version`)
    contexts: dict[str, _Slot] = field(default_factory=dict)
    closers: set[asyncio.Task] = field(default_factory=set)  # each sends the answer of a context the reader ended
    stalled: bool = False
    cut: asyncio.Event = field(default_factory=asyncio.Event)

    def live(self, context_id: str | None) -> _Slot | None:
        """The context if it still runs and is not being ended (a finished task's entry is about to be removed)."""
        ctx = self.contexts.get(context_id) if context_id is not None else None
        return ctx if ctx is not None and ctx.running and not ctx.ending else None

    def live_count(self) -> int:
        """Contexts whose task still runs, ending ones included (they hold their slot until they stop)."""
        return sum(ctx.running for ctx in self.contexts.values())

    async def send(self, message: object) -> None:
        """Queue a message for the writer; a client that stops reading is cut, not waited on forever."""
        if self.stalled:
            raise SlowConsumer("connection is being cut: the client stopped reading")
        try:
            self.outbox.put_nowait(message)  # the common case: room in the outbox, no task and no loop turn
            return
        except asyncio.QueueFull:
            pass
        try:
            async with asyncio.timeout(self.slow_consumer_s):
                await self.outbox.put(message)
        except TimeoutError:
            self.stall()
            raise SlowConsumer(f"client stopped reading for {self.slow_consumer_s:.1f} s; stream cut") from None

    def stall(self) -> None:
        self.stalled = True
        self.cut.set()


class WorkerServer:
    """The websocket server: connections and their contexts. Admission (`self.admission`) decides
    which starts it takes; `self.routes` answers HTTP on the same port."""

    def __init__(self, settings: WorkerSettings, deps: ContextDeps, forwarder: Forwarder | None = None) -> None:
        self.settings = settings
        self.deps = deps
        self.admission = Admission(settings, deps.metrics)
        self.routes = SideRoutes(settings, deps, self.admission)
        self.forwarder: Forwarder | None = None
        self.heat: HeatRecorder | None = None  # counts requests per voice for automatic replicas (entry worker only)
        if forwarder is not None:
            self.join(forwarder)
        if deps.metrics is not None:
            deps.metrics.bind(active_streams=lambda: self.admission.active)

    def join(self, forwarder: Forwarder, heat: HeatRecorder | None = None) -> None:
        """The worker joined the ring: voices it does not own are relayed, and its watcher's view and
        `ring_settings.admit_factor` bound its share of the fleet's load."""
        self.forwarder, self.heat = forwarder, heat
        view = lambda: forwarder.watcher.view  # noqa: E731 - read at each decision, never cached
        self.admission.join(view, forwarder.ring_settings, heat)
        self.routes.view = view

    @property
    def active(self) -> int:
        """Contexts this worker's engine speaks (its load)."""
        return self.admission.active

    @property
    def relayed(self) -> int:
        return self.admission.relayed

    def health(self) -> dict:
        return self.routes.health()

    async def serve(self) -> Server:
        return await serve(self.handle, self.settings.host, self.settings.port, process_request=self.routes.process_request,
                           process_response=self._answer_handshake, max_size=MAX_MESSAGE_BYTES,
                           ping_interval=self.settings.keepalive_s, ping_timeout=self.settings.keepalive_s,
                           close_timeout=self.settings.close_timeout_s)

    def _answer_handshake(self, connection: ServerConnection, request: Request, response: Response) -> Response:
        """Every websocket handshake is answered with this worker's protocol version (so a client
        knows whether it may send version-2 fields, `Start.insist`) and its per-connection stream
        limit (so a client never has to learn it from refusals)."""
        if response.status_code == HTTPStatus.SWITCHING_PROTOCOLS:
            response.headers[PROTOCOL_HEADER] = str(PROTOCOL_VERSION)
            response.headers[CONNECTION_STREAMS_HEADER] = str(self.settings.connection_stream_limit())
        return response

    async def aclose(self) -> None:
        await self.routes.aclose()

    async def handle(self, ws: ServerConnection) -> None:
        if self.settings.socket_send_buffer is not None:
            sock = ws.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.socket_send_buffer)
        version = protocol_version(ws.request.headers.get(PROTOCOL_HEADER)) if ws.request is not None else 1
        conn = _Connection(ws, asyncio.Queue(maxsize=self.settings.send_queue), self.settings.slow_consumer_s,
                           Backlog(self.settings.connection_backlog_limit()), version)
        writer = asyncio.create_task(self._write(conn), name="writer")
        reader = asyncio.create_task(self._read(conn), name="reader")
        cut = asyncio.create_task(conn.cut.wait(), name="cut")
        try:
            await asyncio.wait({reader, writer, cut}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                await self._reader_died(conn, reader.exception())
        finally:
            tasks = [ctx.task for ctx in conn.contexts.values() if ctx.task is not None]
            for ctx in conn.contexts.values():
                if conn.stalled and ctx.context is not None:
                    ctx.context.fail(SlowConsumer("the connection was cut: the client stopped reading"))
                if ctx.task is not None:
                    ctx.task.cancel()
            closers = list(conn.closers)
            for task in (*closers, reader, writer, cut):
                task.cancel()
            await asyncio.gather(*tasks, *closers, reader, writer, cut, return_exceptions=True)
            if conn.stalled:
                await self._cut(conn)

    async def _reader_died(self, conn: _Connection, exc: BaseException) -> None:
        """A bug outside the per-message guard: log it, tell every context, close with 1011."""
        log.error("connection reader died; ending its %d contexts", conn.live_count(), exc_info=exc,
                  extra={"remote": str(conn.ws.remote_address)})
        error = WorkerError(f"the worker stopped reading this connection ({type(exc).__name__}); reconnect")
        for ctx in list(conn.contexts.values()):
            if ctx.running and not ctx.ending:
                self._end_context(conn, ctx, error, retryable=True)
        try:
            async with asyncio.timeout(self.settings.close_timeout_s):
                await asyncio.gather(*conn.closers, return_exceptions=True)
                while not conn.outbox.empty():
                    await asyncio.sleep(0.01)
                await conn.ws.close(INTERNAL_ERROR_CLOSE, "worker error")
        except (TimeoutError, ConnectionClosed, SlowConsumer):
            conn.ws.transport.abort()

    async def _cut(self, conn: _Connection) -> None:
        log.warning("cutting a connection that stopped reading for %.1f s", conn.slow_consumer_s,
                    extra={"remote": str(conn.ws.remote_address)})
        if self.deps.metrics is not None:
            self.deps.metrics.rejected.labels("slow_consumer").inc()
        try:
            async with asyncio.timeout(self.settings.close_timeout_s):
                await conn.ws.close(SLOW_CONSUMER_CLOSE, "slow consumer: client stopped reading")
        except (TimeoutError, ConnectionClosed):
            conn.ws.transport.abort()  # even the close frame cannot be written: drop the TCP connection

    async def _read(self, conn: _Connection) -> None:
        try:
            async for raw in conn.ws:
                try:
                    await self._receive(conn, raw)
                except SlowConsumer:
                    return
        except ConnectionClosed:
            pass

    async def _receive(self, conn: _Connection, raw: str | bytes) -> None:
        """One client message, guarded: whatever goes wrong, the answer is for this message only."""
        try:
            message = parse_client(raw)
        except BadMessage as exc:
            if exc.message_type == "start" and exc.context_id is not None and exc.context_id not in conn.contexts:
                await conn.send(self._stamped(conn, Error(exc.code, exc.message, exc.retryable, exc.context_id)))  # it never opened
            else:
                await self._refuse(conn, exc, exc.message_type, exc.context_id)
            return
        try:
            await self._dispatch(conn, message)
        except (SlowConsumer, asyncio.CancelledError):
            raise
        except WorkerError as exc:
            ending = conn.contexts.get(message.context_id)
            if ending is not None and ending.closer is not None and not ending.closer.done():
                self._refuse_after(conn, ending.closer, exc, message.type, message.context_id)
            else:
                await self._refuse(conn, exc, message.type, message.context_id)
        except Exception as exc:  # a bug handling this message: it is refused, the connection lives on
            log.exception("handling a '%s' message failed", message.type, extra={"context_id": message.context_id})
            await self._refuse(conn, WorkerError(f"internal error: {type(exc).__name__}"), message.type,
                               message.context_id, retryable=True)

    async def _refuse(self, conn: _Connection, exc: WorkerError, message_type: str | None, context_id: str | None,
                      *, retryable: bool | None = None) -> None:
        if self.deps.metrics is not None:
            self.deps.metrics.refused_messages.labels(exc.code).inc()
        await conn.send(Rejected(exc.code, exc.message, exc.retryable if retryable is None else retryable,
                                 context_id, message_type))

    def _refuse_after(self, conn: _Connection, closer: asyncio.Task, exc: WorkerError, message_type: str,
                      context_id: str | None) -> None:
        """Refuse a message for a context the reader is ending only after that context's own answer:
        a client never sees `rejected` for a context before the `error` or `done` that ended it."""
        async def refuse() -> None:
            await asyncio.wait([closer])
            with contextlib.suppress(SlowConsumer):
                await self._refuse(conn, exc, message_type, context_id)

        task = asyncio.create_task(refuse(), name=f"refuse-{context_id}")
        conn.closers.add(task)
        task.add_done_callback(conn.closers.discard)

    async def _dispatch(self, conn: _Connection, message: ClientMessage) -> None:
        """Handle one message without waiting on any context's work (a slow context never delays
        another's messages): a start is admitted and launched, the rest only touch buffers or cancel."""
        if isinstance(message, Start):
            await self._open(conn, message)
            return
        ctx = conn.live(message.context_id)
        if ctx is None:
            ending = conn.contexts.get(message.context_id)
            if ending is not None and (ending.running or ending.ending):
                raise BadRequest(f"context '{message.context_id}' is ending: this message came after its end "
                                 "(its done or error is sent first)")
            raise BadRequest(f"no active context '{message.context_id}'; send 'start' first")
        if isinstance(message, Cancel):
            self._end_context(conn, ctx, None)
            return
        try:
            if isinstance(message, PushText):
                ctx.context.push_text(message.text)
            elif isinstance(message, Flush):
                ctx.context.flush()
            elif isinstance(message, End):
                ctx.context.end()
        except _ENDS_CONTEXT as exc:
            self._end_context(conn, ctx, exc)

    async def _open(self, conn: _Connection, start: Start) -> None:
        """Admit a start (claiming its count at once), answer `opened` (v2), then launch its task."""
        existing = conn.contexts.get(start.context_id)
        if existing is not None and (existing.running or existing.ending):
            if existing.ending:
                raise BadRequest(f"context '{start.context_id}' is still ending on this connection; "
                                 "wait for its done or error before starting it again")
            raise BadRequest(f"context '{start.context_id}' is already active on this connection; "
                             "this start was ignored and the live context carries on")
        try:
            if start.options.alignment is not None and conn.version < 2:
                raise BadRequest("options.alignment needs protocol version 2 (send the handshake header "
                                 f"'{PROTOCOL_HEADER}: 2'): a version-1 connection gets only the version-1 messages")
            route = self.forwarder.decide(start) if self.forwarder is not None else "serve"
            relay = route == "relay"
            ctx = _Slot(start.context_id, self.admission.admit(start, conn.live_count(), relay=relay))
            if route == "spill":
                self.forwarder.spilled(start)  # only once admitted: a refused start spills elsewhere
        except WorkerError as exc:  # the context never opened: this error is its end
            await conn.send(self._stamped(conn, Error(exc.code, exc.message, exc.retryable, start.context_id,
                                                      limit=getattr(exc, "limit", None))))
            return
        conn.contexts[start.context_id] = ctx  # before any await: a second start with this id is refused
        try:
            send = self._context_send(conn, ctx)
            if relay:
                ctx.context = RelayedContext(start, self.deps, send, self.forwarder, backlog=conn.backlog,
                                                 claim_slot=lambda: self._claim_engine(ctx))
            else:
                ctx.context = Context(start, self.deps, send, backlog=conn.backlog)
            if conn.version >= 2:
                await conn.send(Opened(start.context_id, self.admission.active))
        except BaseException as exc:
            self._release(conn, ctx)
            if not isinstance(exc, Exception):  # cancelled: the connection is going
                raise
            if isinstance(exc, WorkerError):  # e.g. its text over a limit
                code, message, retryable = exc.code, exc.message, exc.retryable
            else:  # a bug opening it: its client ends now and may try another worker, not at its own timeout
                log.exception("opening context '%s' failed", start.context_id, extra={"context_id": start.context_id})
                code, retryable = WorkerError.code, True
                message = f"internal error opening the context: {type(exc).__name__}"
            # it never opened: this error is its end
            await conn.send(self._stamped(conn, Error(code, message, retryable, start.context_id)))
            return
        self._launch(conn, ctx)
        if self.heat is not None and start.proxied_by is None:
            with contextlib.suppress(InvalidVoiceId):  # its context gets the clear error when it resolves
                self.heat.record(start.voice)

    def _end_context(self, conn: _Connection, ctx: _Slot, exc: WorkerError | None, *,
                     retryable: bool | None = None) -> None:
        """End a context the reader decided to end (``exc`` None: the client cancelled it): cancel its
        task (aborting its engine request, freeing its slot) and leave its one answer to a closer
        task, so the reader goes on at once however long the context takes to stop."""
        ctx.ending = True
        if exc is not None:
            ctx.context.fail(exc)
        if ctx.task is not None:
            ctx.task.cancel()
        if exc is None:
            trace = ctx.context.trace
            answer: object = Done(ctx.context_id, ContextStats(trace_id=trace.trace_id, span_id=trace.span_id),
                                  reason="cancelled")
        else:
            answer = Error(exc.code, exc.message, exc.retryable if retryable is None else retryable, ctx.context_id)
        closer = ctx.closer = asyncio.create_task(self._close_context(conn, ctx, answer), name=f"close-{ctx.context_id}")
        conn.closers.add(closer)
        closer.add_done_callback(conn.closers.discard)

    async def _close_context(self, conn: _Connection, ctx: _Slot, answer: object) -> None:
        try:
            if ctx.task is not None:
                await asyncio.gather(ctx.task, return_exceptions=True)  # its work has stopped: all its audio is queued
            if ctx.context.claim_end():
                with contextlib.suppress(SlowConsumer):
                    await conn.send(self._stamped(conn, answer))
        finally:  # only now is it gone: until its answer is out, messages for it are refused after that answer
            if conn.contexts.get(ctx.context_id) is ctx:
                del conn.contexts[ctx.context_id]

    def _claim_engine(self, ctx: _Slot) -> None:
        """A relayed context falls back to this worker's engine (`Admission.claim_engine`)."""
        ctx.holds = self.admission.claim_engine(ctx.holds)

    def _release(self, conn: _Connection, ctx: _Slot) -> None:
        self.admission.release(ctx.holds)
        ctx.holds = None
        if ctx.context is not None:
            ctx.context.release()
        if conn.contexts.get(ctx.context_id) is ctx and not ctx.ending:  # an ending one: its closer removes it
            del conn.contexts[ctx.context_id]

    def _launch(self, conn: _Connection, ctx: _Slot) -> None:
        assert ctx.context is not None
        ctx.task = asyncio.create_task(ctx.context.run(), name=f"ctx-{ctx.context_id}")
        ctx.task.add_done_callback(lambda _: self._release(conn, ctx))  # runs even if cancelled before it started

    def _context_send(self, conn: _Connection, ctx: _Slot) -> Send:
        """A context's sends; on a v2 connection its `done`/`error` carry the load right after it ends
        (its own engine slot, still held while it sends them, is not counted)."""
        if conn.version < 2:
            async def send_v1(message: object) -> None:
                await conn.send(_as_version_1(message))

            return send_v1

        async def send(message: object) -> None:
            if isinstance(message, Done | Error) and message.load is None:
                message = replace(message, load=self.admission.active - (ctx.holds == "engine"))
            await conn.send(message)

        return send

    def _stamped(self, conn: _Connection, message: object) -> object:
        """A `done`/`error` the reader or a closer sends, with the load on a v2 connection."""
        if conn.version < 2:
            return _as_version_1(message)
        if isinstance(message, Done | Error) and message.load is None:
            return replace(message, load=self.admission.active)
        return message

    async def _write(self, conn: _Connection) -> None:
        """Drain the outbox; a write the client's socket cannot take within slow_consumer_s cuts it."""
        try:
            while True:
                message = await conn.outbox.get()
                data = message.encode() if isinstance(message, AudioChunk) else encode(message)
                try:
                    async with asyncio.timeout(conn.slow_consumer_s):
                        await conn.ws.send(data)
                except TimeoutError:
                    conn.stall()
                    return
        except ConnectionClosed:
            pass


def _as_version_1(message: object) -> object:
    """A message as version 1 wrote it: a `done` without the trace ids of its stats, an `error`
    without the limit a `busy` hit (a version-1 connection gets exactly the version-1 bytes)."""
    if isinstance(message, Done) and (message.stats.trace_id or message.stats.span_id):
        return replace(message, stats=replace(message.stats, trace_id="", span_id=""))
    if isinstance(message, Error) and message.limit is not None:
        return replace(message, limit=None)
    return message
