"""The pool's routing against real workers (issue 20, item 3): a worker's `busy` moves a start to
the next candidate without hurting the worker's health or spending a failed try, refusals have a
bound of their own, the last try after a refusal `insist`s on a version-2 link, and requests
queued behind a dial to a black-holed owner move on together after one `open_timeout_s` (M7).

Real processes: the session `worker` (max_streams 8) and a small worker of this module
(max_streams 2, no ring of its own, so it refuses only at its capacity), registered in a ring in
the real Redis under ids chosen so that the small one is tara's owner; a TCP listener that never
answers the handshake stands for the black-holed worker.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gpu_worker.client import PoolSettings, RingRouter, WorkerClient, WorkerPool, WorkerRequestError
from tests.fixtures.fleet import WorkerSpec
from tests.gpu_worker.test_pool import fast, ids_with_owners, pcm_bytes, ring_of, silent_server

pytestmark = pytest.mark.timeout(300)


SMALL_WORKER = WorkerSpec("small-pool-worker", ("--max-loras", "1", "--max-streams", "2"),
                          {"VOICERING_WORKER_MAX_STREAMS_PER_CONNECTION": "2"})
WORKERS = (SMALL_WORKER,)  # started ahead of this module (tests/fixtures/fleet.py)


@pytest.fixture(scope="module")
def small_worker(fleet, request):
    (handle,) = fleet.take(request, SMALL_WORKER)
    yield handle
    handle.stop()


async def held_full(worker, client: WorkerClient, count: int) -> list:
    """`count` open contexts with nothing to say (each holds a stream slot), admitted."""
    held = [await client.start("leo", "", options=fast()) for _ in range(count)]
    deadline = time.monotonic() + 30
    while (await asyncio.to_thread(worker.health))["active_streams"] < count:
        assert time.monotonic() < deadline, "the held contexts were never admitted"
        await asyncio.sleep(0.1)
    return held


async def test_a_full_owner_refuses_and_the_start_moves_on_with_insist_and_no_health_cost(small_worker, worker,
                                                                                         redis_url):
    small_id, big_id = ids_with_owners([], ["small", "big"], {"tara": "small"})
    async with ring_of(redis_url, {small_id: small_worker.url, big_id: worker.url}) as (watcher, settings, _), \
            WorkerPool(RingRouter(watcher, settings), PoolSettings(max_attempts=1)) as pool, \
            await WorkerClient.connect(small_worker.url) as client:
        held = await held_full(small_worker, client, 2)
        stream = await pool.start("tara", "The owner is full.", options=fast(3))
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
        # max_attempts=1: the refusal did not spend the one failed try the context has
        assert stream.worker_id == big_id and stream.attempts == 2 and stream.refusals == 1
        assert stream.done.reason == "completed" and len(pcm) == pcm_bytes(stream.done.stats.frames)
        assert pool.peer_stats(small_id).errors == 0 and pool.ejected() == set()  # busy is not a failure
        routing = pool.routing()
        assert (routing.starts, routing.refusals, routing.opened, routing.spills) == (2, 1, 1, 1)
        insists = 1 if pool.peer_stats(big_id).version >= 2 else 0  # only a version-2 link is sent `insist`
        assert routing.insisted == insists
        for h in held:
            await h.cancel()
    await small_worker.wait_idle()
    await worker.wait_idle()


async def test_refusals_have_a_bound_of_their_own(small_worker, redis_url):
    (small_id,) = ids_with_owners([], ["only"], {"tara": "only"})
    async with ring_of(redis_url, {small_id: small_worker.url}) as (watcher, settings, _), \
            WorkerPool(RingRouter(watcher, settings), PoolSettings(max_refusals=0)) as pool, \
            await WorkerClient.connect(small_worker.url) as client:
        held = await held_full(small_worker, client, 2)
        stream = await pool.start("tara", "Full everywhere.", options=fast())
        await stream.end()
        with pytest.raises(WorkerRequestError) as err:
            async for _ in stream.audio():
                pass
        assert err.value.error.code == "busy" and err.value.retryable and stream.attempts == 1
        assert pool.routing().refusals == 1 and pool.ejected() == set() and pool.peer_stats(small_id).errors == 0
        for h in held:
            await h.cancel()
    await small_worker.wait_idle()


async def test_requests_queued_behind_a_black_holed_owner_move_on_together(worker, redis_url):
    """Regression (M7): four contexts for a voice whose owner black-holes its handshake; they
    waited for the dial in turn (the k-th k × open_timeout_s). They share the one dial's outcome
    now and all speak on the next candidate after one timeout."""
    live = "live"
    (hole_id,) = ids_with_owners([live], ["hole"], {"tara": "hole"})
    timeout = 2.0
    async with silent_server() as (hole_url, accepted):
        peers = {live: worker.url, hole_id: hole_url}
        async with ring_of(redis_url, peers) as (watcher, ring, _), \
                WorkerPool(RingRouter(watcher, ring), PoolSettings(open_timeout_s=timeout, max_ejected_share=0.5)) as pool:
            began = time.monotonic()
            streams = await asyncio.gather(*(pool.start("tara", f"Line {i}.", options=fast(i)) for i in range(4)))
            assert time.monotonic() - began < timeout * 3  # old code: the fourth opened after ~4 × 2 s
            assert accepted[0] == 1 and pool.ejected() == {hole_id}
            for stream in streams:
                assert stream.worker_id == live and stream.attempts == 2
                await stream.end()
                assert [chunk async for chunk in stream.audio()] and stream.done.reason == "completed"
    await worker.wait_idle()
