"""The worker's websocket server: one connection, many utterances, audio back as tagged binary frames.

Each connection runs three named tasks under its handler: a reader (client messages -> utterances),
a writer draining a bounded outbox, and one task per utterance. Every message gets an answer and
no message, however malformed, costs the connection or its other contexts:

- a refused message is answered `rejected` (nothing else changed; a context it names carries on);
- an `error` with a context id means that context is over (its task cancelled, its slot freed):
  a refused `start`, a context-ending limit (`text_too_long`, `backlog_full`, `empty_text`), a
  voice or engine failure, an idle context.

Back-pressure:

- **admission**: past ``max_streams`` concurrent utterances on the worker, or the connection's
  share of them (``max_streams_per_connection``), a `start` gets a retryable ``busy`` at once.
- **slow consumers**: a message that cannot be queued, or written to the socket, within
  ``slow_consumer_s`` (the client stopped reading and the kernel's buffers are full) cuts the whole
  connection: its utterances are cancelled (aborting their engine requests), the socket is closed
  with 1008 "slow consumer" (or aborted if even that cannot be written), a log line and the
  ``slow_consumer`` metric record it, and no other connection waits on it.

With a cluster token set, the websocket handshake, /metrics and /prewarm need
``Authorization: Bearer <token>`` (401 otherwise); /health stays open for probes.

HTTP on the same port: ``GET /health`` (liveness and load counts; cheap, no store walk),
``GET /metrics`` (Prometheus text), ``GET /prewarm?voice=a&voice=b`` (starts loading voices in the
background, 202 with an operation id) and ``GET /prewarm/<id>`` (its per-voice status).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gpu_worker.errors import BacklogFull, BadMessage, BadRequest, Busy, EmptyText, SlowConsumer, TextTooLong, WorkerError
from gpu_worker.prewarm import PrewarmBusy, Prewarms
from gpu_worker.protocol import (MAX_MESSAGE_BYTES, MAX_VOICE_ID_BYTES, AudioChunk, Cancel, ClientMessage, Done, End, Error,
                                 Flush, PushText, Rejected, Start, UtteranceStats, encode, parse_client)
from gpu_worker.proxy import Forwarder, ProxiedUtterance
from gpu_worker.session import Backlog, SessionDeps, Utterance
from gpu_worker.settings import WorkerSettings
from hashring.errors import InvalidVoiceId
from hashring.placement import HeatRecorder

log = logging.getLogger(__name__)

SLOW_CONSUMER_CLOSE = 1008
INTERNAL_ERROR_CLOSE = 1011
MAX_PREWARM = 256
_ENDS_CONTEXT = (TextTooLong, BacklogFull, EmptyText)  # limits that end the context they were hit on


@dataclass(slots=True)
class _Connection:
    """Per-connection state, owned by one handler call."""

    ws: ServerConnection
    outbox: asyncio.Queue
    slow_consumer_s: float
    backlog: Backlog
    contexts: dict[str, tuple[Utterance, asyncio.Task]] = field(default_factory=dict)
    stalled: bool = False
    cut: asyncio.Event = field(default_factory=asyncio.Event)

    def live(self, context_id: str | None) -> tuple[Utterance, asyncio.Task] | None:
        """The context if it is still running (a finished task's entry is about to be removed)."""
        entry = self.contexts.get(context_id) if context_id is not None else None
        return entry if entry is not None and not entry[1].done() else None

    def live_count(self) -> int:
        return sum(not task.done() for _, task in self.contexts.values())

    async def send(self, message: object) -> None:
        """Queue a message for the writer; a client that stops reading is cut, not waited on forever."""
        if self.stalled:
            raise SlowConsumer("connection is being cut: the client stopped reading")
        try:
            await asyncio.wait_for(self.outbox.put(message), timeout=self.slow_consumer_s)
        except TimeoutError:
            self.stall()
            raise SlowConsumer(f"client stopped reading for {self.slow_consumer_s:.1f} s; stream cut") from None

    def stall(self) -> None:
        self.stalled = True
        self.cut.set()


class WorkerServer:
    def __init__(self, settings: WorkerSettings, deps: SessionDeps, forwarder: Forwarder | None = None) -> None:
        self.settings = settings
        self.deps = deps
        self.forwarder = forwarder  # set once the worker has joined the ring: voices it does not own are relayed
        self.heat: HeatRecorder | None = None  # counts requests per voice for automatic replicas (entry worker only)
        self.active = 0  # utterances this worker's engine speaks (its load in the ring)
        self.relayed = 0  # utterances relayed to their owners
        self.prewarms = Prewarms(deps.adapters.prewarm) if deps.adapters is not None else None
        if deps.metrics is not None:
            deps.metrics.bind(active_streams=lambda: self.active)

    def health(self) -> dict:
        """Liveness and load as counts: cheap enough for every probe, and no voice ids to anyone."""
        engine_requests = self.deps.engine.unfinished_requests()
        adapters = self.deps.adapters
        alive = getattr(self.deps.engine, "alive", None)
        status = "ok" if alive is None or alive() else "engine_dead"
        return {"status": status, "worker_id": self.settings.worker_id, "active_streams": self.active,
                "relayed_streams": self.relayed,
                "max_streams": self.settings.max_streams, "engine_requests": engine_requests,
                "engine_waiting": getattr(self.deps.engine, "waiting", None),
                "codec_policy": getattr(self.deps.runner, "policy", None),
                "adapters_resident": len(adapters.resident) if adapters is not None else 0,
                **self._ring_health()}

    def _ring_health(self) -> dict:
        """The ring as this worker sees it (epoch, size, summed heartbeat loads): a stale view shows
        as an old epoch, and the load as this worker's routing sees it."""
        if self.forwarder is None:
            return {}
        view = self.forwarder.watcher.view
        return {"ring_epoch": view.epoch, "ring_workers": len(view.ring), "ring_load": sum(view.loads.values())}

    def _authorized(self, request: Request) -> bool:
        """With a cluster token set, every request but /health must carry it (constant-time compare)."""
        token = self.settings.cluster_token
        if not token:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path == "/health":
            health = self.health()
            return _json(HTTPStatus.OK if health["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE, health)
        if not self._authorized(request):
            return _json(HTTPStatus.UNAUTHORIZED, {"error": "this worker needs its cluster token: "
                                                            "'Authorization: Bearer <token>'"})
        if url.path == "/metrics":
            if self.deps.metrics is None:
                return _response(HTTPStatus.NOT_FOUND, b"metrics are off on this worker\n", "text/plain")
            return _response(HTTPStatus.OK, self.deps.metrics.render(), self.deps.metrics.content_type)
        if url.path == "/prewarm" or url.path.startswith("/prewarm/"):
            return self._prewarm(url.path, parse_qs(url.query).get("voice", []))
        return None

    def _prewarm(self, path: str, voices: list[str]) -> Response:
        if self.prewarms is None:
            return _json(HTTPStatus.NOT_FOUND, {"error": "this worker has no adapter cache to prewarm"})
        if path != "/prewarm":
            op = self.prewarms.get(path.removeprefix("/prewarm/"))
            if op is None:
                return _json(HTTPStatus.NOT_FOUND, {"error": "no such prewarm operation (finished ones are kept a while)"})
            return _json(HTTPStatus.OK, op.report())
        if not voices or len(voices) > MAX_PREWARM or any(len(v.encode(errors='replace')) > MAX_VOICE_ID_BYTES for v in voices):
            return _json(HTTPStatus.BAD_REQUEST, {"error": f"give 1..{MAX_PREWARM} voices as /prewarm?voice=a&voice=b"})
        try:
            op = self.prewarms.start(voices)
        except PrewarmBusy as exc:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}, retry_after=1)
        return _json(HTTPStatus.ACCEPTED, {**op.report(), "status_url": f"/prewarm/{op.id}"})

    async def serve(self) -> Server:
        return await serve(self.handle, self.settings.host, self.settings.port, process_request=self._process_request,
                           max_size=MAX_MESSAGE_BYTES, ping_interval=20, ping_timeout=20, close_timeout=self.settings.close_timeout_s)

    async def aclose(self) -> None:
        if self.prewarms is not None:
            await self.prewarms.aclose()

    async def handle(self, ws: ServerConnection) -> None:
        if self.settings.socket_send_buffer is not None:
            sock = ws.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.socket_send_buffer)
        conn = _Connection(ws, asyncio.Queue(maxsize=self.settings.send_queue), self.settings.slow_consumer_s,
                           Backlog(self.settings.connection_backlog_limit()))
        writer = asyncio.create_task(self._write(conn), name="writer")
        reader = asyncio.create_task(self._read(conn), name="reader")
        cut = asyncio.create_task(conn.cut.wait(), name="cut")
        try:
            await asyncio.wait({reader, writer, cut}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                await self._reader_died(conn, reader.exception())
        finally:
            tasks = [task for _, task in conn.contexts.values()]
            for utterance, task in conn.contexts.values():
                if conn.stalled:
                    utterance.fail(SlowConsumer("the connection was cut: the client stopped reading"))
                task.cancel()
            for task in (reader, writer, cut):
                task.cancel()
            await asyncio.gather(*tasks, reader, writer, cut, return_exceptions=True)
            if conn.stalled:
                await self._cut(conn)

    async def _reader_died(self, conn: _Connection, exc: BaseException) -> None:
        """A bug outside the per-message guard: log it, tell every context, close with 1011."""
        log.error("connection reader died; ending its %d contexts", conn.live_count(), exc_info=exc,
                  extra={"remote": str(conn.ws.remote_address)})
        error = WorkerError(f"the worker stopped reading this connection ({type(exc).__name__}); reconnect")
        for utterance, task in list(conn.contexts.values()):
            if not task.done():
                await self._end_context(conn, utterance, task, error, retryable=True)
        try:
            async with asyncio.timeout(self.settings.close_timeout_s):
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
            await asyncio.wait_for(conn.ws.close(SLOW_CONSUMER_CLOSE, "slow consumer: client stopped reading"),
                                   timeout=self.settings.close_timeout_s)
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
            if exc.message_type == "start" and exc.context_id is not None and conn.live(exc.context_id) is None:
                await conn.send(Error(exc.code, exc.message, exc.retryable, exc.context_id))  # it never opened
            else:
                await self._refuse(conn, exc, exc.message_type, exc.context_id)
            return
        try:
            await self._dispatch(conn, message)
        except (SlowConsumer, asyncio.CancelledError):
            raise
        except WorkerError as exc:
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

    async def _dispatch(self, conn: _Connection, message: ClientMessage) -> None:
        if isinstance(message, Start):
            if conn.live(message.context_id) is not None:
                raise BadRequest(f"context '{message.context_id}' is already active on this connection; "
                                 "this start was ignored and the live context carries on")
            try:
                relay = self.forwarder is not None and self.forwarder.should_forward(message)
                self._admit(conn, relay=relay)
                if relay:
                    utterance = ProxiedUtterance(message, self.deps, conn.send, self.forwarder, backlog=conn.backlog)
                else:
                    utterance = Utterance(message, self.deps, conn.send, backlog=conn.backlog)
            except WorkerError as exc:  # the context never opened: this error is its end
                await conn.send(Error(exc.code, exc.message, exc.retryable, message.context_id))
                return
            self._launch(conn, utterance)
            if self.heat is not None and message.proxied_by is None:
                with contextlib.suppress(InvalidVoiceId):  # its context gets the clear error when it resolves
                    self.heat.record(message.voice)
            return
        entry = conn.live(message.context_id)
        if entry is None:
            raise BadRequest(f"no active context '{message.context_id}'; send 'start' first")
        utterance, task = entry
        if isinstance(message, Cancel):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if utterance.claim_end():
                await conn.send(Done(message.context_id, UtteranceStats(), reason="cancelled"))
            return
        try:
            if isinstance(message, PushText):
                utterance.push_text(message.text)
            elif isinstance(message, Flush):
                utterance.flush()
            elif isinstance(message, End):
                utterance.end()
        except _ENDS_CONTEXT as exc:
            await self._end_context(conn, utterance, task, exc)

    async def _end_context(self, conn: _Connection, utterance: Utterance, task: asyncio.Task, exc: WorkerError,
                           *, retryable: bool | None = None) -> None:
        """Cancel a context (aborting its engine request, freeing its slot), then send its one error."""
        utterance.fail(exc)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if utterance.claim_end():
            await conn.send(Error(exc.code, exc.message, exc.retryable if retryable is None else retryable,
                                  utterance.context_id))

    def _admit(self, conn: _Connection, *, relay: bool) -> None:
        """``max_streams`` bounds what this worker's engine speaks; relayed utterances cost it only a
        relay, so they have a bound of their own (``max_relayed_streams``)."""
        limit = self.settings.connection_stream_limit()
        reason, message = None, ""
        if not relay and self.active >= self.settings.max_streams:
            reason = "busy"
            message = f"worker is at its limit of {self.settings.max_streams} concurrent streams; try another replica"
        elif relay and self.relayed >= self.settings.relay_stream_limit():
            reason = "busy"
            message = f"worker relays at most {self.settings.relay_stream_limit()} streams at once; try another worker"
        elif conn.live_count() >= limit:
            reason = "connection_limit"
            message = (f"this connection holds {limit} streams, its share of the worker's {self.settings.max_streams}; "
                       "wait for one to end or use another connection")
        if reason is not None:
            if self.deps.metrics is not None:
                self.deps.metrics.rejected.labels(reason).inc()
            raise Busy(message)

    def _launch(self, conn: _Connection, utterance: Utterance) -> None:
        relayed = isinstance(utterance, ProxiedUtterance)
        if relayed:
            self.relayed += 1
        else:
            self.active += 1
        task = asyncio.create_task(utterance.run(), name=f"ctx-{utterance.context_id}")

        def finished(_: asyncio.Task) -> None:  # runs even if the task was cancelled before it started
            if relayed:
                self.relayed -= 1
            else:
                self.active -= 1
            utterance.release()
            if conn.contexts.get(utterance.context_id, (None, None))[1] is task:
                del conn.contexts[utterance.context_id]

        task.add_done_callback(finished)
        conn.contexts[utterance.context_id] = (utterance, task)

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


def _response(status: HTTPStatus, body: bytes, content_type: str, *, retry_after: int | None = None) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body))})
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return Response(status.value, status.phrase, headers, body)


def _json(status: HTTPStatus, body: dict, *, retry_after: int | None = None) -> Response:
    return _response(status, json.dumps(body).encode(), "application/json", retry_after=retry_after)
