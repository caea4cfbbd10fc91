"""The plugin's seam to the fleet: open a context, feed it text, read its audio.

    Transport.open(voice, text, options) -> Opened(context, acquire_s, connection_reused)
    Context: push(text) / flush() / end() / cancel() / audio() -> PCM chunks (events(): and word timings) / done

Two implementations, one plugin:
- `PoolTransport`: inside the platform, over `gpu_worker.client.pool.WorkerPool` (ring routing or a fixed
  list of URLs, the cluster token, one multiplexed websocket per worker, retry on another replica
  before the first audio).
- `GatewayTransport`: an app developer's own agent, outside the fleet, through the public gateway's
  text-in websocket (`/v1/tts/stream`) with a tenant API key. It speaks the same worker-protocol
  messages over one multiplexed socket (`gpu_worker.client.WorkerClient`), redialed when it drops;
  the gateway routes and retries behind it. Voice names are the tenant's.

**Errors.** Everything that ends a context is raised as `WorkerRequestError` carrying the
protocol's `Error` (code, message, retryable; codes in docs/protocol.md), whether a worker, the
pool or this boundary produced it: Redis never read and an empty ring become `no_worker`
(retryable), an unusable voice id `bad_request`. The plugin maps those codes to livekit's errors
in one place. Messages never carry the Redis password or the token.

Light: imports `gpu_worker.client.pool` / `.protocol` / `.client` and `hashring`, never torch or vLLM.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

from websockets.exceptions import InvalidStatus, WebSocketException

from gpu_worker.client import (ContextStream, PoolSettings, RingPool, RingRouter, WorkerClient, WorkerConnectionLost,
                               WorkerPool, WorkerRequestError, ring_pool)
from gpu_worker.protocol import Alignment, ContextOptions, Done, Error
from hashring.errors import RingError
from hashring.membership import RingWatcher
from hashring.settings import RingSettings

__all__ = ["GatewayTransport", "Opened", "PoolTransport", "Transport", "Context"]


class Context(Protocol):
    """One context on the fleet (`gpu_worker.client.pool.PoolStream` is one)."""

    done: Done | None  # the worker's stats once it completed (None while running, or if it failed)

    async def push(self, text: str) -> None: ...

    async def flush(self) -> None: ...

    async def end(self) -> None: ...

    async def cancel(self) -> None: ...

    def audio(self) -> AsyncIterator[bytes]:
        """24 kHz mono s16le chunks until `done`; raises `WorkerRequestError` if the context fails."""
        ...

    def events(self) -> AsyncIterator[bytes | Alignment]:
        """`audio()` with the context's word timings (`Alignment`) in order among the chunks."""
        ...


class Opened(NamedTuple):
    context: Context
    acquire_s: float  # routing + connection (dial, if any) + sending the start
    connection_reused: bool  # no new connection was opened for it


class Transport(Protocol):
    async def open(self, voice: str, text: str, options: ContextOptions) -> Opened:
        """Start a context (``text`` may be empty: more follows by `push`); raises
        `WorkerRequestError` when no worker takes it."""
        ...

    async def prewarm(self, voice: str) -> int:
        """Open connections to the voice's workers ahead of traffic; how many are connected."""
        ...

    async def aclose(self) -> None: ...


class PoolTransport:
    """Contexts through a `WorkerPool` (cluster token, ring or static routing).

    `ring(...)`: a Redis URL (the transport then owns a `RingPool` chain of its own,
    started on first use, retried on the next use while Redis is down, closed by `aclose`) or a
    running `RingWatcher` that the caller owns. `static(...)`: fixed worker URLs, no Redis."""

    def __init__(self, pool: WorkerPool, *, own_ring: RingPool | None = None) -> None:
        self._pool = pool
        self._own_ring = own_ring
        self._watching = False
        self._lock = asyncio.Lock()

    @classmethod
    def ring(cls, ring: str | RingWatcher, *, settings: RingSettings | None = None, token: str | None = None,
             pool_settings: PoolSettings | None = None) -> PoolTransport:
        """``settings``: the fleet's ring settings (vnodes, replicas and, with a URL, the key prefix:
        every process of a fleet agrees); with a URL its ``redis_url`` is that URL."""
        settings = settings or RingSettings()
        pool_settings = replace(pool_settings or PoolSettings(), token=token)
        if isinstance(ring, RingWatcher):
            return cls(WorkerPool(RingRouter(ring, settings), pool_settings))
        chain = ring_pool(replace(settings, redis_url=ring), pool_settings)
        return cls(chain.pool, own_ring=chain)

    @classmethod
    def static(cls, urls: Sequence[str], *, token: str | None = None,
               pool_settings: PoolSettings | None = None) -> PoolTransport:
        return cls(WorkerPool.static(urls, replace(pool_settings or PoolSettings(), token=token)))

    @property
    def pool(self) -> WorkerPool:
        return self._pool

    @property
    def own_ring(self) -> RingPool | None:
        """The ring chain this transport owns (None: the caller's watcher, or static routing)."""
        return self._own_ring

    async def open(self, voice: str, text: str, options: ContextOptions) -> Opened:
        await self._watch()
        began, handshakes = time.perf_counter(), self._pool.handshakes
        try:
            stream = await self._pool.start(voice, text, options=options)
        except RingError as exc:  # a voice id routing refuses (the pool maps an empty ring itself)
            raise _no_route(exc) from None
        # Another context's dial in the same moment counts as not reused: the conservative reading.
        return Opened(stream, time.perf_counter() - began, self._pool.handshakes == handshakes)

    async def prewarm(self, voice: str) -> int:
        await self._watch()
        try:
            return await self._pool.prewarm(voice)
        except RingError as exc:
            raise _no_route(exc) from None

    async def aclose(self) -> None:
        if self._own_ring is not None:
            await self._own_ring.aclose()  # the pool, then the watcher and the store
        else:
            await self._pool.aclose()

    async def _watch(self) -> None:
        """Start the ring watcher this transport owns, once (no-op for a caller's watcher)."""
        if self._own_ring is None or self._watching:
            return
        async with self._lock:
            if self._watching:
                return
            try:
                await self._own_ring.start()
            except RingError as exc:  # Redis down before the first read: no ring to route on yet
                raise WorkerRequestError(Error("no_worker", f"no worker ring has been read yet: {exc.message}",
                                               exc.retryable)) from None
            self._watching = True


def _no_route(exc: RingError) -> WorkerRequestError:
    return WorkerRequestError(Error("no_worker" if exc.retryable else "bad_request", exc.message, exc.retryable))


class GatewayTransport:
    """Contexts through the public gateway's `/v1/tts/stream` with a tenant API key.

    ``url``: the gateway's base URL (`https://voices.example.com` or `ws://127.0.0.1:8000`; the
    stream path is added). One websocket carries every context (many contexts), opened on
    first use or by `prewarm`, and opened again after it dropped."""

    def __init__(self, url: str, api_key: str, *, open_timeout_s: float = 10.0) -> None:
        base = url.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        self.url = base if base.endswith("/v1/tts/stream") else f"{base}/v1/tts/stream"
        self._key = api_key
        self._open_timeout_s = open_timeout_s
        self._client: WorkerClient | None = None
        self._lock = asyncio.Lock()
        self.connections = 0  # websockets opened over the transport's life

    async def open(self, voice: str, text: str, options: ContextOptions) -> Opened:
        began = time.perf_counter()
        client, reused = await self._connected()
        try:
            stream = await client.start(voice, text, options=options)
        except WorkerConnectionLost as exc:
            raise WorkerRequestError(Error("no_worker", f"the gateway connection dropped: {exc}", True)) from None
        return Opened(_GatewayContext(stream), time.perf_counter() - began, reused)

    async def prewarm(self, voice: str) -> int:
        await self._connected()
        return 1

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _connected(self) -> tuple[WorkerClient, bool]:
        async with self._lock:
            if self._client is not None and not self._client.closed:
                return self._client, True
            try:
                self._client = await WorkerClient.connect(self.url, open_timeout=self._open_timeout_s, token=self._key)
            except InvalidStatus as exc:
                status = exc.response.status_code
                raise WorkerRequestError(Error("unauthorized" if status == 401 else "gateway_refused",
                                               f"the gateway at {self.url} refused the connection (HTTP {status}): "
                                               + _reason(exc), status >= 500)) from None
            except (OSError, TimeoutError, WebSocketException) as exc:
                raise WorkerRequestError(Error("no_worker", f"cannot reach the gateway at {self.url} "
                                                            f"({type(exc).__name__})", True)) from None
            self.connections += 1
            return self._client, False


class _GatewayContext:
    """A `WorkerClient` stream whose dropped connection is a `WorkerRequestError` like every other
    failure: retryable before any audio (nothing was heard), `worker_lost` after."""

    def __init__(self, stream: ContextStream) -> None:
        self._stream = stream

    @property
    def done(self) -> Done | None:
        return self._stream.done

    async def push(self, text: str) -> None:
        await self._guard(self._stream.push(text))

    async def flush(self) -> None:
        await self._guard(self._stream.flush())

    async def end(self) -> None:
        await self._guard(self._stream.end())

    async def cancel(self) -> None:
        await self._guard(self._stream.cancel())

    async def audio(self) -> AsyncIterator[bytes]:
        async for item in self.events():
            if isinstance(item, bytes):
                yield item

    async def events(self) -> AsyncIterator[bytes | Alignment]:
        try:
            async for item in self._stream.events():
                yield item
        except WorkerConnectionLost:
            heard = self._stream.first_audio_at is not None
            raise WorkerRequestError(Error("worker_lost" if heard else "no_worker",
                                           "the gateway connection dropped mid-context", not heard)) from None

    async def _guard(self, sending) -> None:
        try:
            await sending
        except WorkerConnectionLost:
            pass  # audio() reports the drop


def _reason(exc: InvalidStatus) -> str:
    try:
        import json

        return json.loads(exc.response.body)["error"]["message"]
    except Exception:  # not the gateway's JSON error: say only the status
        return "no reason given"

