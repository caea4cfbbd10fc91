"""A websocket client for one worker: many concurrent contexts over one connection.

Pure asyncio + websockets (no torch), so the CLI, tests and the gateway can all use it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gpu_worker.protocol import (
    PROTOCOL_HEADER,
    Alignment,
    AudioChunk,
    Cancel,
    Done,
    End,
    Error,
    Flush,
    Opened,
    PushText,
    Rejected,
    Start,
    ContextOptions,
    encode,
    parse_server,
)

# Errors and refusals not tied to a live stream that a client keeps (the latest ones): a worker,
# or anything posing as one, can send them without end, and the client lives as long as its link.
MAX_CONNECTION_ERRORS = 64


class WorkerRequestError(Exception):
    """The worker answered a context with an error message."""

    def __init__(self, error: Error) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error

    @property
    def retryable(self) -> bool:
        return self.error.retryable


class WorkerConnectionLost(Exception):
    retryable = True


_CLOSED = object()


@dataclass(slots=True)
class Speech:
    """A finished context as seen by the client."""

    pcm: bytes
    done: Done
    client_ttfb_ms: float | None
    chunks: int


async def collect(stream) -> Speech:  # noqa: ANN001 - any stream with end(), audio(), done and timestamps
    """End a started stream's input and gather all of its audio (client and pool streams alike)."""
    await stream.end()
    chunks = [pcm async for pcm in stream.audio()]
    assert stream.done is not None
    ttfb = (stream.first_audio_at - stream.started_at) * 1000.0 if stream.first_audio_at else None
    return Speech(b"".join(chunks), stream.done, ttfb, len(chunks))


class AudioEvents(ABC):
    """What a context's stream reads out: `audio()`, its PCM chunks (word timings gathered in
    `alignments`), or `events()`, the chunks and the `Alignment`s in the order they came. A stream
    class gives `_items`, its one reading loop."""

    __slots__ = ()

    def audio(self) -> AsyncIterator[bytes]:
        return self._items(words=False)

    def events(self) -> AsyncIterator[bytes | Alignment]:
        return self._items(words=True)

    @abstractmethod
    def _items(self, *, words: bool) -> AsyncIterator[bytes | Alignment]:
        """Audio as bytes; each `Alignment` yielded when `words`, else kept in `alignments`."""


@dataclass(slots=True)
class ContextStream(AudioEvents):
    """The client side of one context: iterate PCM chunks, then `done` holds the worker's stats."""

    context_id: str
    _client: WorkerClient
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: Done | None = None
    started_at: float = field(default_factory=time.perf_counter)
    first_audio_at: float | None = None
    rejected: list[Rejected] = field(default_factory=list)  # messages of this context the worker refused
    alignments: list[Alignment] = field(default_factory=list)  # (v2) word timings, as `audio()` passed them

    async def push(self, text: str) -> None:
        await self._client._send(PushText(self.context_id, text))

    async def flush(self) -> None:
        await self._client._send(Flush(self.context_id))

    async def end(self) -> None:
        await self._client._send(End(self.context_id))

    async def cancel(self) -> None:
        await self._client._send(Cancel(self.context_id))

    async def _items(self, *, words: bool) -> AsyncIterator[bytes | Alignment]:
        while True:
            item = await self._queue.get()
            if isinstance(item, AudioChunk):
                if self.first_audio_at is None:
                    self.first_audio_at = time.perf_counter()
                yield item.pcm
            elif isinstance(item, Alignment):
                if words:
                    yield item
                else:
                    self.alignments.append(item)
            elif isinstance(item, Done):
                self.done = item
                return
            elif isinstance(item, Error):
                raise WorkerRequestError(item)
            else:
                raise WorkerConnectionLost("connection to the worker closed mid-stream")


class WorkerClient:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._streams: dict[str, ContextStream] = {}
        self._reader = asyncio.create_task(self._read(), name="worker-client-reader")
        # errors and refusals not tied to a live stream: the latest MAX_CONNECTION_ERRORS, and how many in all
        self.connection_errors: deque[Error | Rejected] = deque(maxlen=MAX_CONNECTION_ERRORS)
        self.connection_errors_total = 0

    @classmethod
    async def connect(cls, url: str, *, open_timeout: float = 10.0, token: str | None = None,
                      version: int = 1) -> WorkerClient:
        """``token``: the workers' cluster token, when they require one. ``version`` 2 asks for the
        version-2 messages (`opened`, word timings); a stream's `alignments` gather its timings."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if version >= 2:
            headers[PROTOCOL_HEADER] = str(version)
        return cls(await connect(url, max_size=1 << 22, open_timeout=open_timeout, additional_headers=headers or None))

    @property
    def closed(self) -> bool:
        """The connection is gone (its reader ended): open a new client for more contexts."""
        return self._reader.done()

    async def start(self, voice: str, text: str = "", *, options: ContextOptions | None = None,
                    context_id: str | None = None, traceparent: str | None = None) -> ContextStream:
        """``traceparent``: the caller's W3C trace context (the worker starts a trace without one)."""
        context_id = context_id or uuid.uuid4().hex[:16]
        stream = ContextStream(context_id, self)
        self._streams[context_id] = stream
        await self._send(Start(context_id, voice, text, options or ContextOptions(), traceparent=traceparent))
        return stream

    async def say(self, voice: str, text: str, *, options: ContextOptions | None = None,
                  traceparent: str | None = None) -> Speech:
        """Speak one text and collect all of its audio."""
        return await collect(await self.start(voice, text, options=options, traceparent=traceparent))

    async def _send(self, message: object) -> None:
        try:
            await self._ws.send(encode(message))
        except ConnectionClosed as exc:
            raise WorkerConnectionLost(f"worker connection closed: {exc}") from None

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                if isinstance(raw, bytes):
                    chunk = AudioChunk.decode(raw)
                    stream = self._streams.get(chunk.context_id)
                    if stream is not None:
                        stream._queue.put_nowait(chunk)
                    continue
                message = parse_server(raw)
                stream = self._streams.get(message.context_id) if message.context_id else None
                if stream is None:
                    if isinstance(message, Error | Rejected):
                        self.connection_errors.append(message)
                        self.connection_errors_total += 1
                    continue
                if isinstance(message, Rejected):  # one message refused; the stream carries on
                    stream.rejected.append(message)
                    continue
                if isinstance(message, Opened):
                    continue
                stream._queue.put_nowait(message)  # an alignment in order with the audio it follows
                if isinstance(message, Done | Error):
                    self._streams.pop(message.context_id, None)
        except ConnectionClosed:
            pass
        finally:
            for stream in self._streams.values():
                stream._queue.put_nowait(_CLOSED)
            self._streams.clear()

    async def aclose(self) -> None:
        await self._ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

