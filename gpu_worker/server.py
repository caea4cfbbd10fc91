"""The worker's websocket server: one connection, many utterances, audio back as tagged binary frames.

Each connection runs three named tasks under its handler: a reader (client messages -> utterances),
a writer draining a bounded outbox, and one task per utterance. Back-pressure:

- **admission**: past ``max_streams`` concurrent utterances a `start` gets a retryable ``busy``
  error at once; nothing is queued silently.
- **slow consumers**: an utterance that cannot queue its audio for ``slow_consumer_s`` (the outbox
  is full because the client stopped reading) cuts the whole connection: its utterances are
  cancelled (aborting their engine requests), the socket is closed with 1008 "slow consumer" (or
  aborted if even that cannot be written), and no other connection waits on it. The outbox fills
  only once the kernel's socket buffers are full: ``socket_send_buffer`` bounds the sender's side
  (autotuned up to tcp_wmem max, ~4 MB, otherwise); the websocket keepalive (20 s + 20 s) is the
  backstop for a client that stops answering altogether.

When the client goes away, every utterance task is cancelled, which aborts its engine request.
HTTP on the same port: ``GET /health`` (liveness and load), ``GET /metrics`` (Prometheus text),
``GET /prewarm?voice=a&voice=b`` (load voices ahead of traffic; JSON report per voice).
"""

from __future__ import annotations

import asyncio
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

from gpu_worker.adapters import AdapterStore
from gpu_worker.errors import BadRequest, Busy, SlowConsumer, WorkerError
from gpu_worker.protocol import AudioChunk, Cancel, Done, End, Error, Flush, PushText, Start, UtteranceStats, encode, parse_client
from gpu_worker.session import SessionDeps, Utterance
from gpu_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

SLOW_CONSUMER_CLOSE = 1008
MAX_PREWARM = 256


@dataclass(slots=True)
class _Connection:
    """Per-connection state, owned by one handler call."""

    ws: ServerConnection
    outbox: asyncio.Queue
    slow_consumer_s: float
    contexts: dict[str, tuple[Utterance, asyncio.Task]] = field(default_factory=dict)
    stalled: bool = False
    cut: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, message: object) -> None:
        """Queue a message for the writer; a client that stops reading is cut, not waited on forever."""
        if self.stalled:
            raise SlowConsumer("connection is being cut: the client stopped reading")
        try:
            await asyncio.wait_for(self.outbox.put(message), timeout=self.slow_consumer_s)
        except TimeoutError:
            self.stalled = True
            self.cut.set()
            raise SlowConsumer(f"client stopped reading for {self.slow_consumer_s:.1f} s; stream cut") from None


class WorkerServer:
    def __init__(self, settings: WorkerSettings, deps: SessionDeps, store: AdapterStore) -> None:
        self.settings = settings
        self.deps = deps
        self.store = store
        self.active = 0
        if deps.metrics is not None:
            deps.metrics.bind(active_streams=lambda: self.active)

    def health(self) -> dict:
        llm = getattr(self.deps.engine, "_llm", None)
        processor = getattr(llm, "output_processor", None)
        engine_requests = processor.get_num_unfinished_requests() if processor is not None else None
        adapters = self.deps.adapters
        return {"status": "ok", "worker_id": self.settings.worker_id, "active_streams": self.active,
                "max_streams": self.settings.max_streams, "engine_requests": engine_requests,
                "engine_waiting": getattr(self.deps.engine, "waiting", None),
                "codec_policy": getattr(self.deps.runner, "policy", None),
                "adapters_resident": adapters.resident if adapters is not None else [],
                "voices": self.store.voices()}

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path == "/health":
            return _response(HTTPStatus.OK, json.dumps(self.health()).encode(), "application/json")
        if url.path == "/metrics":
            if self.deps.metrics is None:
                return _response(HTTPStatus.NOT_FOUND, b"metrics are off on this worker\n", "text/plain")
            return _response(HTTPStatus.OK, self.deps.metrics.render(), self.deps.metrics.content_type)
        if url.path == "/prewarm":
            voices = parse_qs(url.query).get("voice", [])
            if not voices or len(voices) > MAX_PREWARM or self.deps.adapters is None:
                body = {"error": f"give 1..{MAX_PREWARM} voices as /prewarm?voice=a&voice=b"}
                return _response(HTTPStatus.BAD_REQUEST, json.dumps(body).encode(), "application/json")
            report = await self.deps.adapters.prewarm(voices)
            return _response(HTTPStatus.OK, json.dumps(report).encode(), "application/json")
        return None

    async def serve(self) -> Server:
        return await serve(self.handle, self.settings.host, self.settings.port, process_request=self._process_request,
                           max_size=1 << 20, ping_interval=20, ping_timeout=20, close_timeout=self.settings.close_timeout_s)

    async def handle(self, ws: ServerConnection) -> None:
        if self.settings.socket_send_buffer is not None:
            sock = ws.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.socket_send_buffer)
        conn = _Connection(ws, asyncio.Queue(maxsize=self.settings.send_queue), self.settings.slow_consumer_s)
        writer = asyncio.create_task(self._write(conn), name="writer")
        reader = asyncio.create_task(self._read(conn), name="reader")
        cut = asyncio.create_task(conn.cut.wait(), name="cut")
        try:
            await asyncio.wait({reader, writer, cut}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            tasks = [task for _, task in conn.contexts.values()]
            for task in (*tasks, reader, writer, cut):
                task.cancel()
            await asyncio.gather(*tasks, reader, writer, cut, return_exceptions=True)
            if conn.stalled:
                await self._cut(conn)

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
                    await self._dispatch(conn, parse_client(raw))
                except SlowConsumer:
                    return
                except WorkerError as exc:
                    await conn.send(Error(exc.code, exc.message, exc.retryable, _context_of(raw)))
        except (ConnectionClosed, SlowConsumer):
            pass

    async def _dispatch(self, conn: _Connection, message: object) -> None:
        if isinstance(message, Start):
            if message.context_id in conn.contexts:
                raise BadRequest(f"context '{message.context_id}' is already active on this connection")
            if self.active >= self.settings.max_streams:
                if self.deps.metrics is not None:
                    self.deps.metrics.rejected.labels("busy").inc()
                raise Busy(f"worker is at its limit of {self.settings.max_streams} concurrent streams; try another replica")
            self._launch(conn, Utterance(message, self.deps, conn.send))
            return
        entry = conn.contexts.get(message.context_id)
        if entry is None:
            raise BadRequest(f"no active context '{message.context_id}'; send 'start' first")
        utterance, task = entry
        if isinstance(message, PushText):
            utterance.push_text(message.text)
        elif isinstance(message, Flush):
            utterance.flush()
        elif isinstance(message, End):
            try:
                utterance.end()
            except WorkerError:
                task.cancel()
                raise
        elif isinstance(message, Cancel):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await conn.send(Done(message.context_id, UtteranceStats(), reason="cancelled"))

    def _launch(self, conn: _Connection, utterance: Utterance) -> None:
        self.active += 1
        task = asyncio.create_task(utterance.run(), name=f"ctx-{utterance.context_id}")

        def finished(_: asyncio.Task) -> None:  # runs even if the task was cancelled before it started
            self.active -= 1
            conn.contexts.pop(utterance.context_id, None)

        task.add_done_callback(finished)
        conn.contexts[utterance.context_id] = (utterance, task)

    async def _write(self, conn: _Connection) -> None:
        try:
            while True:
                message = await conn.outbox.get()
                if isinstance(message, AudioChunk):
                    await conn.ws.send(message.encode())
                else:
                    await conn.ws.send(encode(message))
        except ConnectionClosed:
            pass


def _response(status: HTTPStatus, body: bytes, content_type: str) -> Response:
    return Response(status.value, status.phrase, Headers({"Content-Type": content_type, "Content-Length": str(len(body))}), body)


def _context_of(raw: str | bytes) -> str | None:
    try:
        value = json.loads(raw).get("context_id")
    except (ValueError, AttributeError, TypeError):
        return None
    return value if isinstance(value, str) else None
