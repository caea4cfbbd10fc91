"""A ring-aware pool of worker connections: route a voice, keep one multiplexed websocket per
worker, eject workers that fail, retry a context elsewhere until its first audio.

The gateway and the worker's proxy both use it; nothing here imports torch or vLLM.

    pool = WorkerPool(RingRouter(watcher, ring_settings))     # or WorkerPool.static([url, ...])
    async with pool:
        stream = await pool.start("tara", "Hello there.", options=ContextOptions(seed=1))
        await stream.end()
        async for pcm in stream.audio(): ...

`WorkerPool` is the small face over four modules, each one idea; imports run downward only:

    pool.py          WorkerPool: start/say/prewarm, what the pool knows (peer_stats, routing), aclose
    stream.py        PoolStream: one context, its candidates, refusals (`busy`, `insist`), retries
                     before audio, first-audio and stall timeouts
    links.py         the table of workers and websockets: dialing (one dial, one outcome; the
                     protocol version header), the reader per connection, health bookkeeping
    ejection.py      outlier ejection, a pure policy (Envoy's outlier detection)
    types.py         PoolSettings, PeerStats, RoutingStats, WorkerLost, NoWorkerAvailable
    routers.py       where a context may go (`RingRouter`, `StaticRouter`)

**Routing.** A start routed by the ring carries `placed` (`Router.places`): the worker that
receives it serves it itself, so one decision-maker (this pool) places each request and no worker
relays it again. Every `load` a worker reports on an answer refreshes the router's estimate.

**Frames a worker would refuse are never sent.** A worker closes a connection that carries a
message over its `max_size` (1009), and with it every context sharing that connection. So each
message is encoded (UTF-8 JSON) and measured before it is sent or kept for a replay: one over
`peer_max_message_bytes` (the worker's own limit, `protocol.MAX_MESSAGE_BYTES`) is refused to
its caller with `text_too_long` (a `start` or `text`) or `bad_request`, not retryable; nothing is
sent, the context is not retried elsewhere, and the connection and the context carry on
(a refused `start` never opens).

**Departed workers.** A worker that left the ring and has no connection left is forgotten, so the
pool's table stays the size of the fleet.

Tasks: one reader per connection and one task per dial under way, owned by the pool, cancelled
and awaited by `aclose`. The caller owns the `RingWatcher`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection, Iterable, Sequence

from websockets.asyncio.client import ClientConnection

from gpu_worker.client.connection import Speech, collect
from gpu_worker.client.links import Links
from gpu_worker.client.stream import PoolStream
from gpu_worker.client.types import NoWorkerAvailable, NoWorkerServing, PeerStats, PoolSettings, RoutingStats, WorkerLost
from gpu_worker.protocol import Start, ContextOptions
from gpu_worker.client.routers import RingRouter, Router, StaticRouter
from hashring.records import WorkerInfo

__all__ = ["NoWorkerAvailable", "NoWorkerServing", "PeerStats", "PoolSettings", "PoolStream", "RingRouter", "Router", "RoutingStats",
           "StaticRouter", "WorkerLost", "WorkerPool"]


class WorkerPool:
    """Contexts to workers over shared connections; see the module docstrings for the rules."""

    def __init__(self, router: Router, settings: PoolSettings | None = None) -> None:
        self.router = router
        self.settings = settings or PoolSettings()
        self._links = Links(router, self.settings)

    @classmethod
    def static(cls, urls: Sequence[str], settings: PoolSettings | None = None) -> WorkerPool:
        return cls(StaticRouter(urls), settings)

    @property
    def handshakes(self) -> int:
        """Websocket handshakes that succeeded, over the pool's life."""
        return self._links.handshakes

    @property
    def _peers(self) -> dict:  # for tests that check the table's size
        return self._links.peers

    async def start(self, voice: str, text: str = "", *, options: ContextOptions | None = None,
                    proxied_by: str | None = None, exclude: Collection[str] = (),
                    traceparent: str | None = None) -> PoolStream:
        """Open a context on the worker routing picks (dialing it if needed).

        ``proxied_by``: the hop marker a forwarding worker sets (its own id); ``exclude``: workers
        never to use for it (a forwarding worker excludes itself); ``traceparent``: the caller's
        span (W3C), sent on every try."""
        start = Start(uuid.uuid4().hex[:16], voice, text, options or ContextOptions(), proxied_by=proxied_by,
                      placed=self.router.places, traceparent=traceparent)
        self._links.frame(start)  # refused here, before routing, if no worker would take it
        stream = PoolStream(self._links, voice, start, exclude)
        await stream._open(None)
        return stream

    async def say(self, voice: str, text: str, *, options: ContextOptions | None = None) -> Speech:
        """Speak one text and collect all of its audio."""
        return await collect(await self.start(voice, text, options=options))

    async def prewarm(self, target: str | Iterable[str]) -> int:
        """Open connections ahead of traffic: to the owners of a voice (a `str`) or to the workers
        at some URLs. Failures count as usual (ejection); returns how many workers are connected."""
        links = self._links
        if isinstance(target, str):
            infos = list(self.router.owners(target))
        else:
            known = {links.address(info): info for info in self.router.workers()}
            infos = [known.get(url) or WorkerInfo(url, url, url) for url in target]
        results = await asyncio.gather(*(links.link(links.peer(info), min_links=1) for info in infos),
                                       return_exceptions=True)
        return sum(not isinstance(r, BaseException) for r in results)

    def ejected(self) -> set[str]:
        """Ids of the workers ejected now."""
        now = time.monotonic()
        return {pid for pid, peer in self._links.peers.items() if peer.health.ejected(now)}

    def peer_stats(self, worker_id: str) -> PeerStats:
        """What this pool knows of one worker (for tests, benches and debugging)."""
        p = self._links.peers[worker_id]
        h = p.health
        return PeerStats(p.dials, len(p.links), p.links_opened, p.streams, h.errors, h.ejections, h.ejection_s,
                         max(0.0, h.ejected_until - time.monotonic()), p.version)

    def routing(self) -> RoutingStats:
        """What routing did since the pool was made: starts, opened, refusals, spills, insisted."""
        return self._links.counts.snapshot()

    def connections(self, worker_id: str) -> tuple[ClientConnection, ...]:
        """The open websockets to one worker."""
        peer = self._links.peers.get(worker_id)
        return tuple(link.ws for link in peer.links) if peer else ()

    async def aclose(self) -> None:
        """Close every connection and await its reader. Open contexts end: `worker_lost` once
        audio was relayed, `no_worker` (the pool is closed) before."""
        await self._links.aclose()

    async def __aenter__(self) -> WorkerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
