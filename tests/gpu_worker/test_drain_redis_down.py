"""SIGTERM while Redis is down (issue #20, M11): a real `voicering worker` on its own real Redis,
which is killed mid-stream before the worker gets SIGTERM. The drain cannot mark the worker in
Redis; it must still let the stream finish whole, close the server, shut the engine down and
exit 0 well within the drain grace."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from gpu_worker.client import WorkerClient
from gpu_worker.cluster import DRAIN_MARK_TIMEOUT_S, drain, join_cluster
from gpu_worker.protocol import ContextOptions
from gpu_worker.settings import WorkerSettings
from hashring.embedded import EmbeddedRedis
from hashring.membership import LEAVE_TIMEOUT_S
from tests.fixtures.models import cluster_args, start_worker

OWN_WORKERS = 1  # a worker on a Redis of the test's own (tests/fixtures/fleet.py)

GRACE_S = 90  # the worker's drain grace: the stream below needs a few seconds of it

pytestmark = pytest.mark.timeout(600)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: it exists
        return True
    return True


async def test_drain_and_leave_with_redis_gone_are_bounded_and_never_raise():
    """The drain itself (no worker process): Redis dies before it; the drain still takes the worker
    out of its own view, waits for its streams, and leaving the ring gives up in bounded time."""
    with EmbeddedRedis() as redis:
        settings = WorkerSettings(model="unused", redis_url=redis.url, worker_id="drain-unit", port=18790,
                                  ring_prefix="test:drain-unit")
        streams = {"n": 1}
        membership = join_cluster(settings, load=lambda: streams["n"])
        cluster = await membership.__aenter__()
        assert cluster is not None and "drain-unit" in cluster.watcher.view.ring
        redis.kill()
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, streams.update, {"n": 0})  # its last stream ends during the grace
        began = time.monotonic()
        assert await drain(cluster, lambda: streams["n"], grace_s=30) == 0
        assert time.monotonic() - began < DRAIN_MARK_TIMEOUT_S + 5
        assert "drain-unit" not in cluster.watcher.view.ring  # new starts here are relayed, not served
        began = time.monotonic()
        await membership.__aexit__(None, None, None)
        assert time.monotonic() - began < LEAVE_TIMEOUT_S + 10


async def test_sigterm_with_redis_down_drains_the_stream_and_exits_cleanly(stand_in, adapter_store, tmp_path):
    with EmbeddedRedis() as redis:
        handle = start_worker(stand_in, adapter_store, tmp_path / "worker.log", "--max-loras", "2",
                              "--max-streams", "8", *cluster_args(redis.url, "drain-solo"),
                              env={"VOICERING_WORKER_RING_PREFIX": "test:drain-solo",
                                   "VOICERING_WORKER_DRAIN_GRACE_S": str(GRACE_S)})
        try:
            async with await WorkerClient.connect(handle.url) as client:
                stream = await client.start("tara", "Let me finish.", options=ContextOptions(max_tokens=7 * 30 + 1,
                                                                                              seed=4))
                await stream.end()
                async for first in stream.audio():  # the worker is generating
                    break
                redis.kill()
                handle.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                rest = b"".join([chunk async for chunk in stream.audio()])
                assert stream.done is not None and stream.done.reason == "completed", handle.log_tail()
                assert stream.done.stats.frames == 30 and first and rest
            code = await asyncio.to_thread(handle.proc.wait, GRACE_S)
            took = time.monotonic() - signalled
        finally:
            handle.stop()
        log = handle.log_path.read_text(errors="replace")
        assert code == 0, handle.log_tail()
        assert took < GRACE_S, took  # the stream ended long before the grace: nothing waited it out
        assert "could not mark worker drain-solo draining in Redis" in log
        assert "drained: 0 stream(s) still running" in log
        assert "failed during shutdown" not in log, handle.log_tail()
        deadline = time.monotonic() + 30
        while _group_alive(handle.proc.pid):  # the engine core and every other child exited too
            assert time.monotonic() < deadline, "the worker's engine core outlived it"
            await asyncio.sleep(0.2)

