"""A worker joins the hash ring while it serves (real Redis server), and leaves it on shutdown."""

from __future__ import annotations

import asyncio

from gpu_worker.settings import WorkerSettings
from gpu_worker.worker import ring_membership
from hashring import RingSettings
from hashring.store import RingStore


async def test_worker_registers_heartbeats_its_load_and_leaves(redis_url):
    settings = WorkerSettings(model="unused", redis_url=redis_url, worker_id="gpu-test-1", port=18765, max_streams=12)
    load = {"streams": 3}
    async with RingStore(RingSettings(redis_url=redis_url)) as store:
        async with ring_membership(settings, load=lambda: load["streams"]):
            snap = await store.snapshot()
            assert "gpu-test-1" in snap.live
            info = snap.workers["gpu-test-1"]
            assert info.ws_url == "ws://127.0.0.1:18765" and info.capacity == 12
            for _ in range(50):  # the heartbeat (every 1 s) reports the worker's load
                if (await store.snapshot()).loads.get("gpu-test-1") == 3:
                    break
                await asyncio.sleep(0.1)
            assert (await store.snapshot()).loads["gpu-test-1"] == 3
        assert "gpu-test-1" not in (await store.snapshot()).live


async def test_without_redis_membership_is_a_no_op():
    async with ring_membership(WorkerSettings(model="unused"), load=lambda: 0):
        pass
