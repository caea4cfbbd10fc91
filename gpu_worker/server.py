"""The worker's websocket server: one connection, many utterances, audio back as tagged binary frames.

Each connection runs a reader (this handler) and one writer task draining a bounded outbox; each
utterance runs its own task. When the client goes away, every utterance task is cancelled, which
aborts its engine request. `GET /health` on the same port reports liveness and load.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from http import HTTPStatus

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gpu_worker.adapters import AdapterStore
from gpu_worker.errors import BadRequest, Busy, SlowConsumer, WorkerError
from gpu_worker.protocol import AudioChunk, Cancel, Done, End, Error, Flush, PushText, Start, encode, parse_client
from gpu_worker.session import SessionDeps, Utterance
from gpu_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Connection:
    """Per-connection state, owned by one handler call."""

    ws: ServerConnection
    outbox: asyncio.Queue
    slow_consumer_s: float
    contexts: dict[str, tuple[Utterance, asyncio.Task]] = field(default_factory=dict)
    stalled: bool = False

    async def send(self, message: object) -> None:
        """Queue a message for the writer; a client that stops reading is cut, not waited on forever."""
        try:
            await asyncio.wait_for(self.outbox.put(message), timeout=self.slow_consumer_s)
        except TimeoutError:
            self.stalled = True
            raise SlowConsumer(f"client stopped reading for {self.slow_consumer_s:.1f} s; stream cut") from None


class WorkerServer:
    def __init__(self, settings: WorkerSettings, deps: SessionDeps, store: AdapterStore) -> None:
        self.settings = settings
        self.deps = deps
        self.store = store
        self.active = 0

    def health(self) -> dict:
        llm = getattr(self.deps.engine, "_llm", None)
        processor = getattr(llm, "output_processor", None)
        engine_requests = processor.get_num_unfinished_requests() if processor is not None else None
        return {"status": "ok", "worker_id": self.settings.worker_id, "active_streams": self.active,
                "max_streams": self.settings.max_streams, "engine_requests": engine_requests,
                "voices": self.store.voices()}

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/health":
            body = json.dumps(self.health()).encode()
            return Response(HTTPStatus.OK.value, "OK", Headers({"Content-Type": "application/json",
                                                                  "Content-Length": str(len(body))}), body)
        return None

    async def serve(self) -> Server:
        return await serve(self.handle, self.settings.host, self.settings.port, process_request=self._process_request,
                           max_size=1 << 20, ping_interval=20, ping_timeout=20)

    async def handle(self, ws: ServerConnection) -> None:
        conn = _Connection(ws, asyncio.Queue(maxsize=self.settings.send_queue), self.settings.slow_consumer_s)
        writer = asyncio.create_task(self._write(conn), name="writer")
        try:
            async for raw in ws:
                try:
                    await self._dispatch(conn, parse_client(raw))
                except WorkerError as exc:
                    context_id = _context_of(raw)
                    await conn.send(Error(exc.code, exc.message, exc.retryable, context_id))
                if conn.stalled:
                    break
        except ConnectionClosed:
            pass
        except SlowConsumer:
            conn.stalled = True
        finally:
            tasks = [task for _, task in conn.contexts.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if conn.stalled:
                await ws.close(1008, "slow consumer: client stopped reading")

    async def _dispatch(self, conn: _Connection, message: object) -> None:
        if isinstance(message, Start):
            if message.context_id in conn.contexts:
                raise BadRequest(f"context '{message.context_id}' is already active on this connection")
            if self.active >= self.settings.max_streams:
                raise Busy(f"worker is at its limit of {self.settings.max_streams} concurrent streams; try another replica")
            voice = self.store.resolve(message.voice)
            utterance = Utterance(message, voice, self.deps, conn.send)
            self._launch(conn, utterance)
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
            await conn.send(Done(message.context_id, _empty_stats(), reason="cancelled"))

    def _launch(self, conn: _Connection, utterance: Utterance) -> None:
        self.active += 1
        task = asyncio.create_task(utterance.run(), name=f"ctx-{utterance.context_id}")

        def finished(_: asyncio.Task) -> None:  # runs even if the task was cancelled before it started
            self.active -= 1
            conn.contexts.pop(utterance.context_id, None)

        task.add_done_callback(finished)
        conn.contexts[utterance.context_id] = (utterance, task)

    async def _write(self, conn: _Connection) -> None:
        while True:
            message = await conn.outbox.get()
            if isinstance(message, AudioChunk):
                await conn.ws.send(message.encode())
            else:
                await conn.ws.send(encode(message))


def _context_of(raw: str | bytes) -> str | None:
    try:
        value = json.loads(raw).get("context_id")
    except (ValueError, AttributeError, TypeError):
        return None
    return value if isinstance(value, str) else None


def _empty_stats():
    from gpu_worker.protocol import UtteranceStats

    return UtteranceStats()
