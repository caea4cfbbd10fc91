"""A Redis failover behind one address, with real Redis processes: a replica is promoted, the old
primary is demoted to its replica, and the address (a Kubernetes Service, a DNS name, a managed
Redis's failover endpoint; here a TCP forwarder on loopback) now leads to the new primary.

Connections dialled before the failover still reach the old primary, which answers every write
with READONLY. redis-py reconnects only on connection errors, so a store that kept its pool would
send every heartbeat to the demoted server until the worker left the ring; the store drops its
pool on READONLY/MASTERDOWN and the next beat dials the address again.

And the same failover watched by a real Redis Sentinel, for a fleet configured with a
`redis+sentinel://` URL: the primary is killed, the Sentinel promotes its replica, and the ring's
heartbeats and a blocking client (the training queue's kind) go on against the new primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from hashring.embedded import EmbeddedRedis, find_redis_server
from hashring.ports import free_port
from hashring.errors import RingUnavailable
from hashring.membership import Heartbeat
from hashring.records import WorkerInfo
from hashring.redis_client import sync_client
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


@contextlib.contextmanager
def sentinel_watching(primary: EmbeddedRedis, folder: Path):
    """One redis-server in Sentinel mode monitoring `primary` as service "fleet" (quorum 1: it alone
    decides), quick to call the primary down (1 s)."""
    port = free_port()
    conf = folder / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                    f"sentinel monitor fleet 127.0.0.1 {primary.port} 1\n"
                    "sentinel down-after-milliseconds fleet 1000\nsentinel failover-timeout fleet 10000\n")
    proc = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        ask = redis.Redis(port=port, socket_timeout=1)
        deadline = time.monotonic() + 30
        while True:  # up, and watching the primary
            try:
                if ask.execute_command("SENTINEL", "get-master-addr-by-name", "fleet"):
                    break
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the Sentinel did not start"
            time.sleep(0.05)
        ask.close()
        yield port
    finally:
        proc.kill()
        proc.wait(10)


def test_sentinel_urls_are_parsed_with_their_sentinels_service_db_and_passwords():
    from hashring.redis_client import parse_sentinel

    target = parse_sentinel("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/fleet/2?sentinel_password=x")
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (target.service, target.db, target.password, target.sentinel_password, target.tls) == (
        "fleet", 2, "s3cret", "x", False)
    assert parse_sentinel("rediss+sentinel://h/fleet").tls and parse_sentinel("redis://h:6379/0") is None
    for bad in ("redis+sentinel://h:26379/", "redis+sentinel:///fleet", "redis+sentinel://h:port/fleet",
                "redis+sentinel://h/fleet/zero"):
        with pytest.raises(ValueError):
            parse_sentinel(bad)


async def test_a_sentinel_url_follows_the_primary_through_a_failover(ring_settings, tmp_path):
    with EmbeddedRedis() as first, EmbeddedRedis() as second:
        old, new = aioredis.from_url(first.url), aioredis.from_url(second.url)
        try:
            await new.replicaof("127.0.0.1", first.port)

            async def linked() -> bool:
                return (await new.info("replication")).get("master_link_status") == "up"

            await until(linked)
            with sentinel_watching(first, tmp_path) as port:
                url = f"redis+sentinel://127.0.0.1:{port}/fleet/0"
                settings = dataclasses.replace(ring_settings, redis_url=url)
                queue = sync_client(url, decode_responses=True, socket_timeout=2)
                assert queue.set("voicering:test:before", "1")
                async with RingStore(settings) as store, \
                        Heartbeat(store, WorkerInfo("w1", "ws://127.0.0.1:1", "ws://127.0.0.1:1")) as beat:
                    async def replicated() -> bool:
                        return await new.hexists(store.keys.workers, "w1")

                    await until(replicated)
                    first.kill()  # the primary dies; the Sentinel promotes the replica

                    async def beating_on_the_promoted_replica() -> bool:
                        role = (await new.execute_command("ROLE"))[0]
                        before = await new.zscore(store.keys.heartbeats, "w1")
                        await asyncio.sleep(3 * settings.heartbeat_interval_s)
                        after = await new.zscore(store.keys.heartbeats, "w1")
                        return role == b"master" and before is not None and after is not None and after > before \
                            and beat.last_error is None

                    await until(beating_on_the_promoted_replica, timeout=60)
                    assert "w1" in (await store.snapshot()).live
                deadline = time.monotonic() + 20
                while True:  # the blocking client asks the Sentinel again on its next connection
                    try:
                        assert queue.set("voicering:test:after", "1")
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                assert await new.get("voicering:test:after") == b"1" and await new.get("voicering:test:before") == b"1"
                queue.close()
        finally:
            await old.aclose()
            await new.aclose()
