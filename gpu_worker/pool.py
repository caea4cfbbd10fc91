"""A ring-aware pool of worker connections: route a voice, keep one multiplexed websocket per
worker, eject workers that fail, retry an utterance elsewhere until its first audio.

The gateway and the worker's proxy both use it; nothing here imports torch or vLLM.

    pool = WorkerPool(RingRouter(watcher, ring_settings))     # or WorkerPool.static([url, ...])
    async with pool:
        stream = await pool.start("tara", "Hello there.", options=UtteranceOptions(seed=1))
        await stream.end()
        async for pcm in stream.audio(): ...

**Routing** (`routers.py`): the ring's placement, or a fixed list of URLs. Workers this utterance
already tried, ejected workers and workers in reconnect back-off are excluded, so placement
spills to the next owner in ring order. If *every* worker is ejected, ejections are ignored
(Envoy's panic mode): a lone worker that restarts is found again without waiting out its ejection.
A start routed by the ring carries `placed` (`Router.places`): the worker that receives it serves
it itself, so one decision-maker (this pool) places each request and no worker relays it again.

**Connections.** One websocket per worker, opened lazily (or by `prewarm`), shared by all the
utterances routed there; `handshakes` counts the websocket handshakes that succeeded. A worker
admits only `max_streams_per_connection` utterances per connection (half its `max_streams`):
when a connection holding k > 0 utterances is answered `busy`, the pool learns "this
connection takes at most k", and the utterance goes to a second connection to the same worker
(at most `max_connections_per_peer`); `busy` on a connection holding nothing means the worker
itself is full, so the utterance moves on to the next owner. A connection older than
`max_connection_age_s` takes no new utterances and closes once its last one ends. Failed dials
back off exponentially (`reconnect_base_s` doubling to `reconnect_max_s`).

**Ejection** (Envoy's outlier detection): a dial that fails (refused, handshake refused or not
answered within `open_timeout_s`) ejects the worker at once; `consecutive_errors` (5) failures on
open connections in a row (a connection lost, `engine_error`, `internal`) eject it too; a
completed utterance resets the count; `busy`, the caller's own mistakes (`bad_request`...) and a
connection the worker closed with 1009 (a message too big: the sender's fault) do not count. An
ejection lasts `ejection_base_s` (30 s) × the worker's ejection count, capped at
`ejection_max_s` (300 s); the count starts over once a worker has stayed un-ejected for
`ejection_max_s`. At most `max_ejected_share` (10 %) of the workers are ejected at once, at least
one. When an ejection ends, the next utterance routed there is the probe: its dial either brings
the worker back or ejects it again, for longer.

**Frames a worker would refuse are never sent.** A worker closes a connection that carries a
message over its `max_size` (1009), and with it every utterance sharing that connection. So each
message is encoded (UTF-8 JSON) and measured before it is sent or kept for a replay: one over
`peer_max_message_bytes` (the worker's own limit, `protocol.MAX_MESSAGE_BYTES`) is refused to
its caller with `text_too_long` (a `start` or `text`) or `bad_request`, not retryable; nothing is
sent, the utterance is not retried elsewhere, and the connection and the utterance carry on
(a refused `start` never opens).

**Hung workers.** A worker that takes a connection (even a websocket handshake) and then never
answers is caught twice: a dial not answered within `open_timeout_s` ejects it, and an
utterance asked to speak (a flush or its end) that gets no first audio within
`first_audio_timeout_s` is cancelled there, the worker is ejected, and the utterance retried
elsewhere (`worker_timeout` if no other worker takes it). After the first audio the connection's
keepalive pings catch a dead link.

**Departed workers.** A worker that left the ring and has no connection left is forgotten, so the
pool's table stays the size of the fleet.

**Retry before audio.** Until the first audio chunk of an utterance has been handed to the
caller, a retryable failure (`busy`, `engine_error`, `internal`, the connection lost, no first
audio in time) sends it to
another worker (or connection), replaying what was pushed so far (start text, pushes, flushes,
end), at most `max_attempts` times. From the first chunk on there is no retry: a lost connection
ends the stream with `WorkerLost` (code `worker_lost`, not retryable) and any worker error is
raised as it came, so audio is never duplicated or spliced from two workers.

Errors (all `WorkerRequestError`, so callers handle one type; `.error.code`, `.retryable`):

    WorkerRequestError      the worker's own error for the utterance (client.py)
    ├── WorkerLost          worker_lost: the connection dropped after audio was relayed
    └── NoWorkerAvailable   no_worker (retryable): every candidate was tried, ejected or full

Tasks: one reader per connection (`pool-link:<worker>#<n>`), owned by the pool, cancelled and
awaited by `aclose`. The caller owns the `RingWatcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.frames import CloseCode

from gpu_worker.client import Speech, WorkerRequestError, collect
from gpu_worker.protocol import (MAX_MESSAGE_BYTES, AudioChunk, Cancel, ClientMessage, Done, End, Error, Flush, PushText,
                                 Rejected, Start, UtteranceOptions, encode, parse_server)
from gpu_worker.routers import RingRouter, Router, StaticRouter
from hashring.errors import EmptyRing
from hashring.records import WorkerInfo

__all__ = ["NoWorkerAvailable", "PeerStats", "PoolSettings", "PoolStream", "RingRouter", "Router", "StaticRouter", "WorkerLost",
           "WorkerPool"]

log = logging.getLogger(__name__)

_LOST = object()  # queued to every utterance of a connection that dropped
_FAILURE_CODES = frozenset({"engine_error", "internal"})  # worker-side failures that count toward ejection


class WorkerLost(WorkerRequestError):
    """The connection to the worker dropped after audio of this utterance reached the caller."""

    def __init__(self, context_id: str, worker_id: str) -> None:
        super().__init__(Error("worker_lost", f"connection to worker {worker_id} was lost mid-utterance, after audio "
                                              "was relayed; the utterance cannot be resumed", False, context_id))


class NoWorkerAvailable(WorkerRequestError):
    """No worker could take the utterance: all were tried, ejected or full. Retry shortly."""

    def __init__(self, message: str, context_id: str | None = None) -> None:
        super().__init__(Error("no_worker", message, True, context_id))


@dataclass(frozen=True, slots=True)
class PoolSettings:
    open_timeout_s: float = 5.0  # TCP connect + websocket handshake
    max_connection_age_s: float = 600.0  # older connections take no new utterances
    max_connections_per_peer: int = 4
    max_attempts: int = 4  # tries per utterance (workers or connections), the first included
    reconnect_base_s: float = 0.1  # failed dials back off: base × 2**(n-1), capped, ±20 % jitter
    reconnect_max_s: float = 5.0
    consecutive_errors: int = 5  # failures on open connections that eject a worker
    ejection_base_s: float = 30.0  # × ejection count
    ejection_max_s: float = 300.0
    max_ejected_share: float = 0.1  # of the workers known to the router; at least one
    max_message_bytes: int = 1 << 22  # the largest message taken from a worker
    peer_max_message_bytes: int = MAX_MESSAGE_BYTES  # the largest a worker takes: bigger ones are refused unsent
    first_audio_timeout_s: float | None = 30.0  # after a flush or end, the longest wait for an utterance's first audio
    address: Literal["ws_url", "proxy_url"] = "ws_url"  # which registered address to dial (workers use proxy_url)
    token: str | None = None  # the cluster token, sent as `Authorization: Bearer` on every dial

    def __post_init__(self) -> None:
        if self.max_connections_per_peer < 1 or self.max_attempts < 1 or self.consecutive_errors < 1:
            raise ValueError("max_connections_per_peer, max_attempts and consecutive_errors must be >= 1")
        if not 0 < self.max_ejected_share <= 1:
            raise ValueError("max_ejected_share must be in (0, 1]")
        if self.peer_max_message_bytes < 1:
            raise ValueError("peer_max_message_bytes must be >= 1")
        if self.first_audio_timeout_s is not None and self.first_audio_timeout_s <= 0:
            raise ValueError("first_audio_timeout_s must be > 0 (or None: wait as long as it takes)")


@dataclass(frozen=True, slots=True)
class PeerStats:
    dials: int  # connection attempts, successful or not
    links: int  # connections open now
    links_opened: int  # connections opened over the pool's life
    streams: int  # utterances open there now
    errors: int  # consecutive failures on open connections
    ejections: int  # the current ejection count (sets the length of the next one)
    ejection_s: float  # length of the latest ejection
    ejected_for_s: float  # left of the current ejection, 0 when not ejected


class _Received(NamedTuple):
    """An audio chunk as the connection's reader took it off the socket, and when (perf_counter)."""

    chunk: AudioChunk
    at: float


@dataclass(eq=False, slots=True)
class _Attempt:
    """One try of an utterance: a context on one connection."""

    context_id: str
    link: _Link
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    next_seq: int = 0
    share_busy: bool = False  # answered `busy` while its connection held other utterances


@dataclass(eq=False)
class _Link:
    """One websocket to a worker and the contexts open on it."""

    peer: _Peer
    ws: ClientConnection
    name: str
    opened_at: float
    contexts: dict[str, _Attempt] = field(default_factory=dict)
    limit: int | None = None  # utterances it takes at once, learned from `busy`
    retiring: bool = False  # takes no new utterances; closed when the last one ends
    reader: asyncio.Task | None = None

    def has_room(self) -> bool:
        return not self.retiring and (self.limit is None or len(self.contexts) < self.limit)


@dataclass(eq=False)
class _Peer:
    """What the pool knows of one worker: its connections and its health."""

    info: WorkerInfo
    links: list[_Link] = field(default_factory=list)
    dial_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dials: int = 0  # attempts, successful or not
    dial_failures: int = 0  # in a row
    next_dial_at: float = 0.0
    errors: int = 0  # consecutive failures on open connections
    ejections: int = 0
    ejected_until: float = 0.0
    ejection_s: float = 0.0  # length of the latest ejection
    links_opened: int = 0

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def streams(self) -> int:
        return sum(len(link.contexts) for link in self.links)


class WorkerPool:
    """Utterances to workers over shared connections; see the module docstring for the rules."""

    def __init__(self, router: Router, settings: PoolSettings | None = None) -> None:
        self.router = router
        self.settings = settings or PoolSettings()
        self._peers: dict[str, _Peer] = {}
        self._closing = False
        self.handshakes = 0  # websocket handshakes that succeeded, over the pool's life

    @classmethod
    def static(cls, urls: Sequence[str], settings: PoolSettings | None = None) -> WorkerPool:
        return cls(StaticRouter(urls), settings)

    # -- what callers use -------------------------------------------------------------------------

    async def start(self, voice: str, text: str = "", *, options: UtteranceOptions | None = None,
                    proxied_by: str | None = None, exclude: Collection[str] = ()) -> PoolStream:
        """Open an utterance on the worker routing picks (dialing it if needed).

        ``proxied_by``: the hop marker a forwarding worker sets (its own id); ``exclude``: workers
        never to use for it (a forwarding worker excludes itself)."""
        start = Start(uuid.uuid4().hex[:16], voice, text, options or UtteranceOptions(), proxied_by=proxied_by,
                      placed=self.router.places)
        self._frame(start)  # refused here, before routing, if no worker would take it
        stream = PoolStream(self, voice, start, exclude)
        await stream._open(None)
        return stream

    async def say(self, voice: str, text: str, *, options: UtteranceOptions | None = None) -> Speech:
        """Speak one text and collect all of its audio."""
        return await collect(await self.start(voice, text, options=options))

    async def prewarm(self, target: str | Iterable[str]) -> int:
        """Open connections ahead of traffic: to the owners of a voice (a `str`) or to the workers
        at some URLs. Failures count as usual (ejection); returns how many workers are connected."""
        if isinstance(target, str):
            infos = list(self.router.owners(target))
        else:
            known = {self._address(info): info for info in self.router.workers()}
            infos = [known.get(url) or WorkerInfo(url, url, url) for url in target]
        results = await asyncio.gather(*(self._dial(self._peer(info), min_links=1) for info in infos),
                                       return_exceptions=True)
        return sum(not isinstance(r, BaseException) for r in results)

    def ejected(self) -> set[str]:
        """Ids of the workers ejected now."""
        now = time.monotonic()
        return {pid for pid, peer in self._peers.items() if peer.ejected_until > now}

    def peer_stats(self, worker_id: str) -> PeerStats:
        """What this pool knows of one worker (for tests, benches and debugging)."""
        p = self._peers[worker_id]
        return PeerStats(p.dials, len(p.links), p.links_opened, p.streams, p.errors, p.ejections, p.ejection_s,
                         max(0.0, p.ejected_until - time.monotonic()))

    def connections(self, worker_id: str) -> tuple[ClientConnection, ...]:
        """The open websockets to one worker."""
        peer = self._peers.get(worker_id)
        return tuple(link.ws for link in peer.links) if peer else ()

    async def aclose(self) -> None:
        """Close every connection and await its reader. Open utterances end: `worker_lost` once
        audio was relayed, `no_worker` (the pool is closed) before."""
        self._closing = True
        links = [link for peer in self._peers.values() for link in peer.links]
        await asyncio.gather(*(link.ws.close() for link in links), return_exceptions=True)
        for link in links:
            if link.reader is not None:
                link.reader.cancel()
        await asyncio.gather(*(link.reader for link in links if link.reader is not None), return_exceptions=True)

    async def __aenter__(self) -> WorkerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- routing ----------------------------------------------------------------------------------

    def _peer(self, info: WorkerInfo) -> _Peer:
        peer = self._peers.get(info.id)
        if peer is None:
            peer = self._peers[info.id] = _Peer(info)
        elif self._address(peer.info) != self._address(info):  # re-registered elsewhere: new utterances use the new address
            peer.info = info
            for link in peer.links:
                link.retiring = True
        return peer

    def _forget_departed(self) -> None:
        """Drop workers that left the ring and hold no connection (their ejection state goes too:
        a worker that comes back under the same id starts afresh)."""
        known = {info.id for info in self.router.workers()}
        for pid in [pid for pid, peer in self._peers.items() if pid not in known and not peer.links]:
            del self._peers[pid]

    def _pick(self, voice: str, tried: Collection[str]) -> _Peer:
        self._forget_departed()
        now = time.monotonic()
        unavailable = {pid for pid, p in self._peers.items() if p.ejected_until > now or p.next_dial_at > now}
        loads = {pid: p.streams for pid, p in self._peers.items()}
        try:
            return self._peer(self.router.pick(voice, loads, set(tried) | unavailable))
        except EmptyRing:
            if not unavailable:
                raise
        try:  # is anything left outside the ejected set at all? then the tried ones were the last
            self.router.pick(voice, loads, unavailable)
        except EmptyRing:
            log.warning("every worker for voice %r is ejected or backing off; trying them anyway (panic)", voice)
            return self._peer(self.router.pick(voice, loads, tried))
        raise EmptyRing(f"every worker that could take voice {voice!r} was tried, is ejected or is full")

    async def _link(self, peer: _Peer) -> _Link | None:
        """A connection to `peer` with room for one more utterance; None if it has its most."""
        now = time.monotonic()
        for link in list(peer.links):
            if not link.retiring and now - link.opened_at > self.settings.max_connection_age_s:
                link.retiring = True
                if not link.contexts:
                    await link.ws.close()
            if link.has_room():
                return link
        return await self._dial(peer)

    def _frame(self, message: ClientMessage) -> bytes:
        """`message` as the UTF-8 bytes of its text frame, or WorkerRequestError (not retryable) when
        a worker would refuse it: sent, it would close the shared connection (1009)."""
        try:
            frame = encode(message).encode()
        except UnicodeEncodeError:  # a lone surrogate: no websocket text frame can carry it
            raise WorkerRequestError(Error("bad_request", f"this '{message.type}' holds text that is not valid Unicode; "
                                                          "send UTF-8 text", False, message.context_id)) from None
        limit = self.settings.peer_max_message_bytes
        if len(frame) > limit:
            code = "text_too_long" if isinstance(message, Start | PushText) else "bad_request"
            raise WorkerRequestError(Error(code, f"this '{message.type}' is {len(frame)} bytes encoded, over the "
                                                 f"{limit} bytes a worker takes in one message; send the text in "
                                                 "smaller pieces", False, message.context_id))
        return frame

    def _address(self, info: WorkerInfo) -> str:
        return info.proxy_url if self.settings.address == "proxy_url" else info.ws_url

    @property
    def _headers(self) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token else None

    async def _dial(self, peer: _Peer, *, min_links: int | None = None) -> _Link | None:
        async with peer.dial_lock:  # concurrent utterances wait for one dial instead of each making one
            live = [link for link in peer.links if not link.retiring]
            if min_links is not None and len(live) >= min_links:
                return live[0]
            if min_links is None:
                for link in live:
                    if link.has_room():
                        return link
                if len(live) >= self.settings.max_connections_per_peer:
                    return None
            if self._closing:
                raise NoWorkerAvailable("the pool is closed")
            delay = peer.next_dial_at - time.monotonic()
            if delay > 0:  # only in panic mode: routing skips workers that are backing off
                await asyncio.sleep(delay)
            peer.dials += 1
            try:
                ws = await connect(self._address(peer.info), open_timeout=self.settings.open_timeout_s,
                                   max_size=self.settings.max_message_bytes, additional_headers=self._headers)
            except (OSError, TimeoutError, WebSocketException) as exc:
                self._dial_failed(peer, exc)
                raise
            if self._closing:  # closed while dialing: this connection has no owner any more
                await ws.close()
                raise NoWorkerAvailable("the pool is closed")
            peer.dial_failures, peer.next_dial_at = 0, 0.0
            self.handshakes += 1
            peer.links_opened += 1
            link = _Link(peer, ws, f"pool-link:{peer.id}#{peer.links_opened}", time.monotonic())
            link.reader = asyncio.create_task(self._read(link), name=link.name)
            peer.links.append(link)
            return link

    # -- health -----------------------------------------------------------------------------------

    def _dial_failed(self, peer: _Peer, exc: BaseException) -> None:
        s = self.settings
        peer.dial_failures += 1
        backoff = min(s.reconnect_max_s, s.reconnect_base_s * 2 ** (peer.dial_failures - 1))
        peer.next_dial_at = time.monotonic() + backoff * random.uniform(0.8, 1.2)
        log.warning("worker %s at %s: connect failed (%s)", peer.id, self._address(peer.info), type(exc).__name__ + f": {exc}")
        self._eject(peer, f"connect failed: {type(exc).__name__}")

    def _failed(self, peer: _Peer, why: str) -> None:
        peer.errors += 1
        if peer.errors >= self.settings.consecutive_errors:
            self._eject(peer, f"{peer.errors} failures in a row, the last: {why}")

    def _succeeded(self, peer: _Peer) -> None:
        peer.errors = 0

    def _eject(self, peer: _Peer, why: str) -> None:
        s, now = self.settings, time.monotonic()
        if peer.ejected_until > now:
            return
        known = {info.id for info in self.router.workers()} | {peer.id}
        ejected = sum(1 for pid in known if pid in self._peers and self._peers[pid].ejected_until > now)
        if ejected >= max(1, math.floor(s.max_ejected_share * len(known))):
            log.warning("worker %s not ejected (%s): %d of %d workers are ejected already", peer.id, why, ejected,
                        len(known))
            return
        if now - peer.ejected_until > s.ejection_max_s:
            peer.ejections = 0  # healthy long enough: the next ejection is a first one again
        peer.ejections += 1
        period = min(s.ejection_max_s, s.ejection_base_s * peer.ejections)
        peer.ejected_until, peer.ejection_s = now + period, period
        peer.errors = 0
        log.warning("worker %s ejected for %.0f s (ejection %d): %s", peer.id, period, peer.ejections, why)

    # -- one connection ---------------------------------------------------------------------------

    async def _read(self, link: _Link) -> None:
        try:
            async for raw in link.ws:
                if isinstance(raw, bytes):
                    received_at = time.perf_counter()
                    chunk = AudioChunk.decode(raw)
                    attempt = link.contexts.get(chunk.context_id)
                    if attempt is not None:
                        attempt.queue.put_nowait(_Received(chunk, received_at))
                    continue
                message = parse_server(raw)
                attempt = link.contexts.get(message.context_id) if message.context_id else None
                if attempt is None:  # e.g. `rejected` for a push that crossed the context's end
                    level = logging.DEBUG if isinstance(message, Rejected) else logging.WARNING
                    log.log(level, "worker %s: %s not tied to a live utterance: %s", link.peer.id, message.type, message)
                    continue
                attempt.queue.put_nowait(message)  # a Rejected is queued too: the stream notes it and goes on
                if isinstance(message, Done | Error):
                    del link.contexts[message.context_id]
                    if isinstance(message, Error) and message.code == "busy" and link.contexts:
                        link.limit = min(link.limit or len(link.contexts), len(link.contexts))
                        attempt.share_busy = True
                    if link.retiring and not link.contexts:
                        await link.ws.close()
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("worker %s: reading %s failed; dropping the connection", link.peer.id, link.name)
            link.ws.transport.abort()
        finally:
            if link in link.peer.links:
                link.peer.links.remove(link)
            too_big = link.ws.close_code == CloseCode.MESSAGE_TOO_BIG
            if too_big:  # our fault, not the worker's: never counted toward its ejection
                log.error("worker %s closed %s: a message sent there was over its size limit", link.peer.id, link.name)
            elif link.contexts and not self._closing:
                self._failed(link.peer, "connection lost")
            for attempt in link.contexts.values():
                attempt.queue.put_nowait(_LOST)
            link.contexts.clear()


class PoolStream:
    """One utterance through the pool: push/flush/end/cancel, then iterate `audio()`; `done` holds
    the worker's stats. `worker_id` is the worker serving it now, `attempts` the tries so far;
    `last_chunk_received_at` is when the connection's reader took the chunk `audio()` yielded last
    off the socket (perf_counter), so a relay can time its own share of each chunk's trip."""

    def __init__(self, pool: WorkerPool, voice: str, start: Start, exclude: Collection[str] = ()) -> None:
        self._pool = pool
        self.voice = voice
        self._log: list[ClientMessage] | None = [start]  # replayed on a retry; dropped at the first audio
        self._lock = asyncio.Lock()
        self._attempt: _Attempt | None = None
        self._tried: set[str] = set(exclude)
        self._cancelled = False
        self.attempts = 0
        self.done: Done | None = None
        self.rejected: list[Rejected] = []  # messages of this utterance a worker refused (no effect)
        self.started_at = time.perf_counter()
        self.first_audio_at: float | None = None
        self.last_chunk_received_at: float | None = None
        self._asked_at: float | None = None  # when the current try was last asked to speak (flush/end), monotonic
        # text sent since the last flush: only a flush or end with something to say asks the worker to
        # speak (an empty flush has no audio to wait for: the caller, not the worker, would be timed out)
        self._unspoken = bool(start.text.strip())

    @property
    def context_id(self) -> str:
        return self._attempt.context_id if self._attempt else ""

    @property
    def worker_id(self) -> str | None:
        return self._attempt.link.peer.id if self._attempt else None

    async def push(self, text: str) -> None:
        await self._send(PushText(self.context_id, text))

    async def flush(self) -> None:
        await self._send(Flush(self.context_id))

    async def end(self) -> None:
        await self._send(End(self.context_id))

    async def cancel(self) -> None:
        self._cancelled = True
        await self._send(Cancel(self.context_id))

    async def audio(self) -> AsyncIterator[bytes]:
        while True:
            attempt = self._attempt
            assert attempt is not None
            try:
                item = await asyncio.wait_for(attempt.queue.get(), self._first_audio_wait())
            except TimeoutError:
                await self._timed_out(attempt)
                continue
            if isinstance(item, _Received):
                chunk = item.chunk
                if chunk.seq != attempt.next_seq:
                    await self.cancel()
                    raise WorkerRequestError(Error("internal", f"audio chunk {chunk.seq} arrived where {attempt.next_seq}"
                                                               " was due", False, attempt.context_id))
                attempt.next_seq += 1
                if self.first_audio_at is None:
                    self.first_audio_at = time.perf_counter()
                    self._log = None  # audio reached the caller: no retry from here on
                self.last_chunk_received_at = item.at
                yield chunk.pcm
            elif isinstance(item, Rejected):
                self.rejected.append(item)
            elif isinstance(item, Done):
                self._pool._succeeded(attempt.link.peer)
                self.done = item
                return
            elif self._cancelled:
                return  # cancelled: whatever ended it, there is nothing more to say
            elif isinstance(item, Error):
                if item.code in _FAILURE_CODES:
                    self._pool._failed(attempt.link.peer, item.code)
                if not item.retryable or self._log is None:
                    raise WorkerRequestError(item)
                await self._retry(attempt, item)
            else:  # _LOST
                if self._log is None:
                    raise WorkerLost(attempt.context_id, attempt.link.peer.id)
                await self._retry(attempt, None)

    # -- internals --------------------------------------------------------------------------------

    def _first_audio_wait(self) -> float | None:
        """How long the next wait may take: bounded only while audio is due and none came yet."""
        limit = self._pool.settings.first_audio_timeout_s
        if limit is None or self._log is None or self._asked_at is None or self._cancelled:
            return None
        return max(0.0, self._asked_at + limit - time.monotonic())

    async def _timed_out(self, attempt: _Attempt) -> None:
        """No first audio in time: give up on this worker (cancel there, eject it) and retry."""
        pool, peer = self._pool, attempt.link.peer
        limit = pool.settings.first_audio_timeout_s
        if attempt.link.contexts.pop(attempt.context_id, None) is not None:
            with contextlib.suppress(ConnectionClosed):
                await attempt.link.ws.send(pool._frame(Cancel(attempt.context_id)), text=True)
        pool._eject(peer, f"no first audio within {limit:.0f} s")
        await self._retry(attempt, Error("worker_timeout", f"worker {peer.id} sent no audio within {limit:.0f} s of "
                                                           "being asked to speak", True, attempt.context_id))

    async def _send(self, message: ClientMessage) -> None:
        async with self._lock:
            attempt = self._attempt
            frame = self._pool._frame(_for(message, attempt.context_id) if attempt else message)  # refused: no effect
            if isinstance(message, PushText) and message.text.strip():
                self._unspoken = True
            elif isinstance(message, Flush | End) and self._unspoken:
                self._asked_at, self._unspoken = time.monotonic(), False
            if self._log is not None:
                self._log.append(message)
            if attempt is None or attempt.context_id not in attempt.link.contexts:
                return  # the context is over; audio() retries with the log or reports why
            try:
                await attempt.link.ws.send(frame, text=True)
            except ConnectionClosed:
                pass  # the reader queues _LOST: audio() retries or ends with worker_lost

    async def _retry(self, failed: _Attempt, error: Error | None) -> None:
        if not failed.share_busy:
            self._tried.add(failed.link.peer.id)  # not a connection-share `busy`: try another worker
        log.info("utterance %s: %s on worker %s before any audio; retrying", failed.context_id,
                 error.code if error else "connection lost", failed.link.peer.id)
        await self._open(error)

    async def _open(self, last_error: Error | None) -> None:
        """Route, connect and replay the log, until one worker takes it or the tries run out."""
        pool = self._pool
        async with self._lock:
            while True:
                if pool._closing:
                    raise NoWorkerAvailable("the pool is closed")
                if self.attempts >= pool.settings.max_attempts:
                    self._give_up(last_error, f"{self.attempts} tries")
                try:
                    peer = pool._pick(self.voice, self._tried)
                except EmptyRing as exc:
                    self._give_up(last_error, exc.message)
                self.attempts += 1
                try:
                    link = await pool._link(peer)
                except (OSError, TimeoutError, WebSocketException):
                    self._tried.add(peer.id)
                    continue
                if link is None:  # every connection it may have is full: next worker
                    self._tried.add(peer.id)
                    continue
                attempt = _Attempt(uuid.uuid4().hex[:16], link)
                link.contexts[attempt.context_id] = attempt
                self._attempt = attempt
                if self._asked_at is not None:  # the replay asks again: the new worker gets the full wait
                    self._asked_at = time.monotonic()
                try:
                    for message in self._log or ():  # each was measured when it was first sent
                        await link.ws.send(pool._frame(_for(message, attempt.context_id)), text=True)
                except ConnectionClosed:
                    pass  # the reader queues _LOST for it: audio() comes back here
                return

    def _give_up(self, last_error: Error | None, why: str) -> None:
        if last_error is not None:
            raise WorkerRequestError(last_error)
        raise NoWorkerAvailable(f"no worker could take voice {self.voice!r}: {why}")


def _for(message: ClientMessage, context_id: str) -> ClientMessage:
    """`message` addressed to the context of the current try."""
    return message if message.context_id == context_id else replace(message, context_id=context_id)
