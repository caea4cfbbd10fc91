"""A worker joins the hash ring while it serves (real Redis server), registers its internal address
for other workers' proxies, drains on request, and leaves the ring on shutdown."""

from __future__ import annotations

import asyncio

from gpu_worker.cluster import drain, join_cluster
from gpu_worker.settings import WorkerSettings
from hashring import RingSettings
from hashring.store import RingStore

PREFIX = "test:worker-ring"


async def test_worker_registers_heartbeats_its_load_and_leaves(redis_url):
    settings = WorkerSettings(model="unused", redis_url=redis_url, worker_id="gpu-test-1", port=18765, max_streams=12,
                              internal_url="ws://10.0.0.7:18766", ring_prefix=PREFIX)
    load = {"streams": 3}
    async with RingStore(RingSettings(redis_url=redis_url, prefix=PREFIX)) as store:
        async with join_cluster(settings, load=lambda: load["streams"]) as cluster:
            assert cluster is not None
            snap = await store.snapshot()
            assert "gpu-test-1" in snap.live
            info = snap.workers["gpu-test-1"]
            assert info.ws_url == "ws://127.0.0.1:18765" and info.capacity == 12
            assert info.proxy_url == "ws://10.0.0.7:18766"  # where other workers' proxies dial
            for _ in range(50):  # the heartbeat (every 1 s) reports the worker's load
                if (await store.snapshot()).loads.get("gpu-test-1") == 3:
                    break
                await asyncio.sleep(0.1)
            assert (await store.snapshot()).loads["gpu-test-1"] == 3
            load["streams"] = 0
            assert await drain(cluster, lambda: load["streams"], grace_s=5) == 0
            assert "gpu-test-1" in (await store.snapshot()).draining
            assert "gpu-test-1" not in cluster.watcher.view.ring  # its own view places nothing here now
        assert "gpu-test-1" not in (await store.snapshot()).live


async def test_drain_waits_for_streams_only_as_long_as_the_grace_period(redis_url):
    settings = WorkerSettings(model="unused", redis_url=redis_url, worker_id="gpu-test-2", ring_prefix=PREFIX)
    async with join_cluster(settings, load=lambda: 1) as cluster:
        assert await drain(cluster, lambda: 1, grace_s=0.3) == 1


async def test_without_redis_membership_is_a_no_op():
    async with join_cluster(WorkerSettings(model="unused"), load=lambda: 0) as cluster:
        assert cluster is None
