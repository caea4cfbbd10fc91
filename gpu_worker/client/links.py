"""The pool's connections: one table of workers (`Peer`), their websockets (`Link`) and the
contexts open on each (`Attempt`); dialing, reading, and each worker's health.

**Dialing.** One websocket per worker, opened lazily, shared by all the contexts routed there,
each dial carrying `PROTOCOL_HEADER: PROTOCOL_VERSION`; the version the worker answers is kept
per link (a worker from before negotiation answers nothing: version 1). A worker admits only
`max_streams_per_connection` contexts per connection and says how many on the handshake
(`CONNECTION_STREAMS_HEADER`): a link with its most takes no new context and the next try may
open a second connection (at most `max_connections_per_peer`). A worker that does not say so is
learned from: a `busy` for the connection's limit (`Error.limit == "connection"`, or no limit
named by a worker from before it named them) on a connection holding k > 0 means "at most k".
Any other `busy` (capacity, share, relay) is the worker's state now, never the link's. A connection older than `max_connection_age_s` takes no new
contexts and closes once its last one ends. Failed dials back off exponentially.

**One dial, one outcome.** Contexts that need a connection to a worker while one is being dialed
wait for that dial and share its outcome: a black-holed worker costs all of them one
`open_timeout_s`, together, and each moves on to its next candidate (issue 20, M7).

**Reading.** One reader task per connection (`pool-link:<worker>#<n>`) hands each message to its
context's queue, refreshes the router's load estimate from every `load` a worker reports
(`opened`, `done`, `error`), and counts routing events (`RoutingCounts`). A connection lost with
contexts on it counts one failure for the worker (not when it closed with 1009: our fault).

**Health** is `ejection.EjectionPolicy`'s; this module applies it to the table.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.frames import CloseCode

from gpu_worker.client.connection import WorkerRequestError
from gpu_worker.client.ejection import Health
from gpu_worker.client.types import NoWorkerAvailable, PoolSettings, RoutingStats
from gpu_worker.protocol import (CONNECTION_STREAMS_HEADER, PROTOCOL_HEADER, PROTOCOL_VERSION, AudioChunk, ClientMessage,
                                 Done, Error, Opened, PushText, Rejected, Start, connection_streams, encode, parse_server,
                                 protocol_version)
from gpu_worker.client.routers import Router
from hashring.records import WorkerInfo

__all__ = ["LOST", "Attempt", "Link", "Links", "Peer", "Received", "RoutingCounts"]

log = logging.getLogger(__name__)

LOST = object()  # queued to every context of a connection that dropped
DIAL_ERRORS = (OSError, TimeoutError, WebSocketException)


class Received(NamedTuple):
    """An audio chunk as the connection's reader took it off the socket, and when (perf_counter)."""

    chunk: AudioChunk
    at: float


@dataclass(eq=False, slots=True)
class Attempt:
    """One try of a context: a context on one connection."""

    context_id: str
    link: Link
    voice: str = ""
    owner: bool = True  # the worker is one of the voice's owners (else it is a spill)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    next_seq: int = 0
    connection_busy: bool = False  # answered `busy` for its connection's limit: another connection may take it
    opened: bool = False  # the worker took it (`opened`, or on a version-1 link its first audio or `done`)
    opened_at: float | None = None  # when the reader saw it taken (perf_counter)


@dataclass(eq=False)
class Link:
    """One websocket to a worker and the contexts open on it."""

    peer: Peer
    ws: ClientConnection
    name: str
    opened_at: float
    version: int = 1  # the protocol version the worker answered on the handshake
    contexts: dict[str, Attempt] = field(default_factory=dict)
    limit: int | None = None  # contexts it takes at once: the worker's word on the handshake, else learned
    retiring: bool = False  # takes no new contexts; closed when the last one ends
    reader: asyncio.Task | None = None

    def __post_init__(self) -> None:
        self.told = self.limit is not None  # the worker said its limit on the handshake

    def has_room(self) -> bool:
        return not self.retiring and (self.limit is None or len(self.contexts) < self.limit)


@dataclass(eq=False)
class Peer:
    """What the pool knows of one worker: its connections, its health, the dial under way."""

    info: WorkerInfo
    links: list[Link] = field(default_factory=list)
    health: Health = field(default_factory=Health)
    dialing: asyncio.Task | None = None  # the dial under way: every waiter shares its outcome
    dials: int = 0  # attempts, successful or not
    dial_failures: int = 0  # in a row
    next_dial_at: float = 0.0
    links_opened: int = 0
    opening: int = 0  # contexts routed here that have no context on a link yet
    version: int = 0  # the version its newest link answered; 0: never connected

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def streams(self) -> int:
        return sum(len(link.contexts) for link in self.links)


@dataclass(slots=True)
class RoutingCounts:
    starts: int = 0
    opened: int = 0
    refusals: int = 0
    spills: int = 0
    insisted: int = 0

    def snapshot(self) -> RoutingStats:
        return RoutingStats(self.starts, self.opened, self.refusals, self.spills, self.insisted)


class Links:
    """The pool's table of workers and connections."""

    def __init__(self, router: Router, settings: PoolSettings) -> None:
        self.router = router
        self.settings = settings
        self.policy = settings.ejection
        self.peers: dict[str, Peer] = {}
        self.counts = RoutingCounts()
        self.closing = False
        self.handshakes = 0  # websocket handshakes that succeeded, over the pool's life

    # -- the table --------------------------------------------------------------------------------

    def peer(self, info: WorkerInfo) -> Peer:
        peer = self.peers.get(info.id)
        if peer is None:
            peer = self.peers[info.id] = Peer(info)
        elif self.address(peer.info) != self.address(info):  # re-registered elsewhere: new contexts use the new address
            peer.info = info
            for link in peer.links:
                link.retiring = True
        return peer

    def forget_departed(self) -> None:
        """Drop workers that left the ring and hold no connection (their ejection state goes too:
        a worker that comes back under the same id starts afresh)."""
        known = {info.id for info in self.router.workers()}
        for pid in [pid for pid, p in self.peers.items() if pid not in known and not p.links and p.dialing is None]:
            del self.peers[pid]

    def loads(self) -> dict[str, int]:
        """This pool's contexts per worker: open, plus routed there and still connecting."""
        return {pid: p.streams + p.opening for pid, p in self.peers.items()}

    def unavailable(self, worker_id: str, now: float) -> bool:
        """Ejected or backing off after a failed dial: routing skips it (unless every worker is)."""
        p = self.peers.get(worker_id)
        return p is not None and (p.health.ejected(now) or p.next_dial_at > now)

    def address(self, info: WorkerInfo) -> str:
        return info.proxy_url if self.settings.address == "proxy_url" else info.ws_url

    def frame(self, message: ClientMessage) -> bytes:
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

    # -- connections ------------------------------------------------------------------------------

    async def link(self, peer: Peer, *, min_links: int | None = None) -> Link | None:
        """A connection to `peer` with room for one more context (None if it has its most), or,
        with `min_links`, any live one once it has that many. Raises what a failed dial raised."""
        while True:
            now = time.monotonic()
            live: list[Link] = []
            for link in list(peer.links):
                if not link.retiring and now - link.opened_at > self.settings.max_connection_age_s:
                    link.retiring = True
                    if not link.contexts:
                        await link.ws.close()
                if not link.retiring:
                    live.append(link)
            if min_links is not None and len(live) >= min_links:
                return live[0]
            if min_links is None:
                for link in live:
                    if link.has_room():
                        return link
            if self.closing:
                raise NoWorkerAvailable("the pool is closed")
            if peer.dialing is None:
                if min_links is None and len(live) >= self.settings.max_connections_per_peer:
                    return None
                peer.dialing = asyncio.create_task(self._dial(peer), name=f"pool-dial:{peer.id}")
                peer.dialing.add_done_callback(_retrieved)
            dialing = peer.dialing
            try:
                await asyncio.shield(dialing)  # a failed dial raises here for every waiter at once
            except asyncio.CancelledError:
                if dialing.cancelled() and self.closing:  # aclose ended the dial, not this waiter
                    raise NoWorkerAvailable("the pool is closed") from None
                raise
            # the new link is in peer.links now; look again (others waiting may have filled it)

    async def _dial(self, peer: Peer) -> Link:
        try:
            delay = peer.next_dial_at - time.monotonic()
            if delay > 0:  # only in panic mode: routing skips workers that are backing off
                await asyncio.sleep(delay)
            peer.dials += 1
            try:
                ws = await connect(self.address(peer.info), open_timeout=self.settings.open_timeout_s,
                                   max_size=self.settings.max_message_bytes, additional_headers=self._headers())
            except DIAL_ERRORS as exc:
                self._dial_failed(peer, exc)
                raise
            if self.closing:  # closed while dialing: this connection has no owner any more
                await ws.close()
                raise NoWorkerAvailable("the pool is closed")
            peer.dial_failures, peer.next_dial_at = 0, 0.0
            self.handshakes += 1
            peer.links_opened += 1
            headers = ws.response.headers if ws.response is not None else {}
            link = Link(peer, ws, f"pool-link:{peer.id}#{peer.links_opened}", time.monotonic(),
                        version=protocol_version(headers.get(PROTOCOL_HEADER)),
                        limit=connection_streams(headers.get(CONNECTION_STREAMS_HEADER)))
            peer.version = link.version
            link.reader = asyncio.create_task(self._read(link), name=link.name)
            peer.links.append(link)
            return link
        finally:
            peer.dialing = None

    def _headers(self) -> dict[str, str]:
        headers = {PROTOCOL_HEADER: str(PROTOCOL_VERSION)}
        if self.settings.token:
            headers["Authorization"] = f"Bearer {self.settings.token}"
        return headers

    async def aclose(self) -> None:
        """Close every connection, cancel dials under way, await every task."""
        self.closing = True
        dials = [p.dialing for p in self.peers.values() if p.dialing is not None]
        for task in dials:
            task.cancel()
        links = [link for peer in self.peers.values() for link in peer.links]
        await asyncio.gather(*(link.ws.close() for link in links), *dials, return_exceptions=True)
        for link in links:
            if link.reader is not None:
                link.reader.cancel()
        await asyncio.gather(*(link.reader for link in links if link.reader is not None), return_exceptions=True)

    # -- health -----------------------------------------------------------------------------------

    def _dial_failed(self, peer: Peer, exc: BaseException) -> None:
        s = self.settings
        peer.dial_failures += 1
        backoff = min(s.reconnect_max_s, s.reconnect_base_s * 2 ** (peer.dial_failures - 1))
        peer.next_dial_at = time.monotonic() + backoff * random.uniform(0.8, 1.2)
        log.warning("worker %s at %s: connect failed (%s)", peer.id, self.address(peer.info), type(exc).__name__ + f": {exc}")
        self.eject(peer, f"connect failed: {type(exc).__name__}")

    def failed(self, peer: Peer, why: str) -> None:
        if self.policy.failed(peer.health):
            self.eject(peer, f"{peer.health.errors} failures in a row, the last: {why}")

    def succeeded(self, peer: Peer) -> None:
        self.policy.succeeded(peer.health)

    def eject(self, peer: Peer, why: str) -> None:
        now = time.monotonic()
        if peer.health.ejected(now):
            return
        known = {info.id for info in self.router.workers()} | {peer.id}
        ejected = sum(1 for pid in known if pid in self.peers and self.peers[pid].health.ejected(now))
        period = self.policy.eject(peer.health, now, ejected=ejected, known=len(known))
        if period is None:
            log.warning("worker %s not ejected (%s): %d of %d workers are ejected already", peer.id, why, ejected,
                        len(known))
        else:
            log.warning("worker %s ejected for %.0f s (ejection %d): %s", peer.id, period, peer.health.ejections, why)

    # -- one connection ---------------------------------------------------------------------------

    async def _read(self, link: Link) -> None:
        try:
            async for raw in link.ws:
                if isinstance(raw, bytes):
                    received_at = time.perf_counter()
                    chunk = AudioChunk.decode(raw)
                    attempt = link.contexts.get(chunk.context_id)
                    if attempt is not None:
                        self._took(attempt)
                        attempt.queue.put_nowait(Received(chunk, received_at))
                    continue
                message = parse_server(raw)
                attempt = link.contexts.get(message.context_id) if message.context_id else None
                if attempt is None:  # e.g. `rejected` for a push that crossed the context's end
                    level = logging.DEBUG if isinstance(message, Rejected | Done | Opened) else logging.WARNING
                    log.log(level, "worker %s: %s not tied to a live context: %s", link.peer.id, message.type, message)
                    continue
                if isinstance(message, Opened):
                    self._took(attempt)
                    self._answered(link, message.load)
                    continue
                attempt.queue.put_nowait(message)  # a Rejected is queued too: the stream notes it and goes on
                if isinstance(message, Done | Error):
                    del link.contexts[message.context_id]
                    if isinstance(message, Done):
                        self._took(attempt)
                    elif message.code == "busy":
                        self.counts.refusals += 1
                        if message.limit in ("connection", None) and link.contexts:
                            attempt.connection_busy = True
                            if not link.told:  # a worker that says its limit is never second-guessed
                                link.limit = min(link.limit or len(link.contexts), len(link.contexts))
                    self._answered(link, message.load)
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
            elif link.contexts and not self.closing:
                self.failed(link.peer, "connection lost")
            for attempt in link.contexts.values():
                attempt.queue.put_nowait(LOST)
            link.contexts.clear()

    def _took(self, attempt: Attempt) -> None:
        """The worker took `attempt` (counted once; it likely holds the voice's adapter now)."""
        if not attempt.opened:
            attempt.opened, attempt.opened_at = True, time.perf_counter()
            self.counts.opened += 1
            self.counts.spills += not attempt.owner
            self.router.took(attempt.link.peer.id, attempt.voice)

    def _answered(self, link: Link, load: int | None) -> None:
        """A worker's own count rode on an answer: as good as a heartbeat, and newer."""
        if load is not None:
            self.router.answered(link.peer.id, load, link.peer.streams + link.peer.opening)


def _retrieved(task: asyncio.Task) -> None:
    """A dial's failure is raised to every waiter; retrieved here too, for when none is left."""
    if not task.cancelled():
        task.exception()
