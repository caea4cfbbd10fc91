"""A Redis failover behind one address, with real Redis processes: a replica is promoted, the old
primary is demoted to its replica, and the address (a Kubernetes Service, a DNS name, a managed
Redis's failover endpoint; here a TCP forwarder on loopback) now leads to the new primary.

Connections dialled before the failover still reach the old primary, which answers every write
with READONLY. redis-py reconnects only on connection errors, so a store that kept its pool would
send every heartbeat to the demoted server until the worker left the ring; the store drops its
pool on READONLY/MASTERDOWN and the next beat dials the address again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
import redis.asyncio as aioredis

from hashring.embedded import EmbeddedRedis
from hashring.errors import RingUnavailable
from hashring.membership import Heartbeat
from hashring.records import WorkerInfo
from hashring.store import RingStore

pytestmark = pytest.mark.timeout(120)


class Endpoint:
    """Forwards each new TCP connection to `target`; established ones stay where they were dialled."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task] = set()

    async def __aenter__(self) -> Endpoint:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()


async def until(predicate, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def test_heartbeats_follow_a_failover_to_the_promoted_replica(ring_settings):
    with EmbeddedRedis() as first, EmbeddedRedis() as second:
        old = aioredis.from_url(first.url)
        new = aioredis.from_url(second.url)
        try:
            await new.replicaof("127.0.0.1", first.port)
            async with Endpoint(first.port) as endpoint:
                settings = dataclasses.replace(ring_settings, redis_url=f"redis://127.0.0.1:{endpoint.port}/0")
                async with RingStore(settings) as store, \
                        Heartbeat(store, WorkerInfo("w1", "ws://127.0.0.1:1", "ws://127.0.0.1:1")) as beat:
                    workers = store.keys.workers

                    async def replicated() -> bool:
                        return await new.hexists(workers, "w1")

                    await until(replicated)
                    # the failover: the replica is promoted, the old primary follows it, the address moves
                    await new.replicaof("NO", "ONE")
                    await old.replicaof("127.0.0.1", second.port)
                    endpoint.target = second.port

                    async def beating_on_the_new_primary() -> bool:
                        before = await new.zscore(store.keys.heartbeats, "w1")
                        await asyncio.sleep(3 * settings.heartbeat_interval_s)
                        after = await new.zscore(store.keys.heartbeats, "w1")
                        return before is not None and after is not None and after > before and beat.last_error is None

                    await until(beating_on_the_new_primary)
                    snap = await store.snapshot()
                    assert "w1" in snap.live and "w1" in snap.workers
                    assert await store.set_draining("w1", True) > 0  # operator writes land too
                    assert await new.sismember(store.keys.draining, "w1")
                    with pytest.raises(RingUnavailable, match="READONLY"):  # what the old primary says now
                        async with RingStore(dataclasses.replace(settings, redis_url=first.url)) as stale:
                            await stale.heartbeat("w1", 0)
        finally:
            await old.aclose()
            await new.aclose()
