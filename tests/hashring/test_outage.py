"""Redis outages against real redis-servers: an outage longer than the heartbeat TTL reaps nobody
(no heartbeat could be written during it), and after a restart without data readers keep their
ring while the workers register again one by one, instead of taking each partial ring."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from hashring.embedded import EmbeddedRedis
from hashring.membership import Heartbeat, RingWatcher
from hashring.records import Snapshot
from hashring.settings import RingSettings
from hashring.store import RingStore
from tests.hashring.test_membership import info

pytestmark = pytest.mark.timeout(60)


def kept_redis(folder: Path) -> EmbeddedRedis:
    """A Redis that keeps every write it acknowledged through a SIGKILL: AOF with an fsync per write.
    Redis's usual fsync every second (deploy/) may lose its last writes to a kill, the more so on a
    busy disk: a write that comes while the previous second's fsync still runs waits up to 2 s in
    memory, acknowledged. Beside two CPU burners the suite lost w2's registration that way (the
    restart was then the lost-data case of the empty-restart test, which the ring handles). These tests are
    about an outage with the data whole."""
    return EmbeddedRedis(data_dir=folder, args=("--appendfsync", "always"))


def first_reader_after(settings: RingSettings) -> Snapshot:
    """One snapshot by another process's reader, taken while this test's event loop is blocked: no
    heartbeat of the workers in this process can reach Redis before it (the worst order there is)."""
    async def read() -> Snapshot:
        async with RingStore(settings) as store:
            return await store.snapshot()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, read()).result(timeout=30)


class RingSizes:
    """Samples the ring a request would see every 20 ms."""

    def __init__(self, watcher: RingWatcher) -> None:
        self.watcher, self.smallest = watcher, len(watcher.view.ring)

    async def run(self) -> None:
        while True:
            self.smallest = min(self.smallest, len(self.watcher.view.ring))
            await asyncio.sleep(0.02)


async def _sample(stack: AsyncExitStack, watcher: RingWatcher) -> RingSizes:
    sizes = RingSizes(watcher)
    task = asyncio.create_task(sizes.run(), name="sample-ring")

    async def stop() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    stack.push_async_callback(stop)
    return sizes


async def test_an_outage_longer_than_the_ttl_reaps_no_live_worker(ring_settings, tmp_path):
    """Redis with its data (AOF) is down for 4 TTLs. When it is back the first reader finds every
    heartbeat older than the TTL; the workers are alive (they heartbeat again within an interval),
    so it must not reap them, and no reader's ring may empty and refill."""
    async with AsyncExitStack() as stack:
        redis = stack.enter_context(kept_redis(tmp_path / "redis"))
        s = dataclasses.replace(ring_settings, redis_url=redis.url)
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        for i in range(3):
            await stack.enter_async_context(Heartbeat(store, info(i)))
        before = await watcher.wait_for(lambda v: len(v.ring) == 3, 5)
        sizes = await _sample(stack, watcher)

        redis.kill()
        await asyncio.sleep(4 * s.heartbeat_ttl_s)
        redis.start()  # same port, same data: every heartbeat in it is 4 TTLs old
        snap = first_reader_after(s)
        assert snap.live == {"w0", "w1", "w2"}, "the first reader after the outage reaped live workers"

        after = await watcher.wait_for(lambda v: len(v.ring) == 3 and not watcher.stale, 10)
        await asyncio.sleep(s.heartbeat_ttl_s + 2 * s.refresh_interval_s)  # past the grace: still all there
        assert after.ring.digest() == before.ring.digest() == watcher.view.ring.digest()
        assert sizes.smallest == 3


async def test_a_worker_that_died_during_an_outage_leaves_one_ttl_after_it(ring_settings, tmp_path):
    """The grace is one TTL from Redis coming back, not forever: a worker that did not survive the
    outage is reaped then, while the others stay."""
    async with AsyncExitStack() as stack:
        redis = stack.enter_context(kept_redis(tmp_path / "redis"))
        s = dataclasses.replace(ring_settings, redis_url=redis.url)
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beats = [await stack.enter_async_context(Heartbeat(store, info(i))) for i in range(3)]
        await watcher.wait_for(lambda v: len(v.ring) == 3, 5)

        redis.kill()
        await beats[2].aclose(deregister=False)  # w2 dies while Redis is down
        await asyncio.sleep(2 * s.heartbeat_ttl_s)
        redis.start()
        view = await watcher.wait_for(lambda v: "w2" not in v.ring and not watcher.stale, 10)
        assert {n.id for n in view.ring.nodes} == {"w0", "w1"}
        assert view.workers["w2"].status == "down"


async def test_readers_keep_their_ring_while_workers_register_again_after_an_empty_restart(
        ring_settings, redis_server):
    """Redis restarts empty and the workers come back one at a time (two are slow): the reader
    keeps the whole ring it had instead of taking the one-worker ring, then takes the rebuilt ring,
    the same as before, once all three are back."""
    s = dataclasses.replace(ring_settings, heartbeat_ttl_s=5.0)  # a hold that covers a loaded CI box
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)  # leave the shared server running whatever happens
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beats = [await stack.enter_async_context(Heartbeat(store, info(i))) for i in range(3)]
        before = await watcher.wait_for(lambda v: len(v.ring) == 3, 5)
        sizes = await _sample(stack, watcher)
        for beat in beats[1:]:
            await beat.aclose(deregister=False)  # w1 and w2 are slow to notice

        redis_server.kill()
        redis_server.start()  # same port, empty: w0 registers again on its next heartbeat
        async with asyncio.timeout(10):
            while (await store.snapshot()).live != {"w0"} or "registered again" not in str(watcher.last_error):
                await asyncio.sleep(0.05)
        assert watcher.stale and len(watcher.view.ring) == 3  # w0 alone is in Redis; the reader waits
        for i in (1, 2):
            await stack.enter_async_context(Heartbeat(store, info(i)))
        after = await watcher.wait_for(lambda v: len(v.ring) == 3 and not watcher.stale, 10)
        assert after.ring.digest() == before.ring.digest()
        assert sizes.smallest == 3


async def test_a_worker_that_never_registers_again_is_dropped_after_one_ttl(ring_settings, redis_server):
    """The hold ends: a worker that is not back one heartbeat TTL after the restart was seen is
    taken out, and the reader serves the ring of the workers that did come back."""
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)
        store = await stack.enter_async_context(RingStore(ring_settings))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beats = [await stack.enter_async_context(Heartbeat(store, info(i))) for i in range(2)]
        await watcher.wait_for(lambda v: len(v.ring) == 2, 5)
        await beats[1].aclose(deregister=False)  # w1 is gone for good

        redis_server.kill()
        redis_server.start()
        view = await watcher.wait_for(lambda v: {n.id for n in v.ring.nodes} == {"w0"} and not watcher.stale, 10)
        assert "w1" not in view.workers
