"""One decision-maker per request (issue #20): the pool chooses among a voice's owners by two
random choices on its estimates, marks the start it placed, and the worker that receives a placed
start serves it itself (reporting a spill when it is not an owner) instead of relaying it.
Real Redis, a real websocket server; no worker process."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from contextlib import AsyncExitStack

import pytest
from websockets.asyncio.server import serve

from gpu_worker.client import RingRouter, WorkerPool, WorkerRequestError
from gpu_worker.protocol import Error, Start, encode, parse_client
from gpu_worker.proxy import Forwarder
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import HeatRecorder, ReplicaControl, place
from hashring.records import WorkerInfo
from hashring.settings import RingSettings
from hashring.store import RingStore

pytestmark = pytest.mark.timeout(60)


async def fleet(stack: AsyncExitStack, redis_url: str, prefix: str, urls: dict[str, str]):
    settings = RingSettings(redis_url=redis_url, prefix=f"{prefix}:{uuid.uuid4().hex[:8]}", vnodes=64, heartbeat_interval_s=0.1,
                            refresh_interval_s=0.2)
    store = await stack.enter_async_context(RingStore(settings))
    for wid, url in urls.items():
        await stack.enter_async_context(Heartbeat(store, WorkerInfo(wid, url, url)))
    watcher = await stack.enter_async_context(RingWatcher(store))
    await watcher.wait_for(lambda v: len(v.ring) == len(urls), 5)
    return settings, store, watcher


async def test_routers_with_the_same_stale_equal_loads_spread_over_the_owners(redis_url):
    """Regression: arg-min on equal reported loads sent every router's request to owners[0]."""
    async with AsyncExitStack() as stack:
        urls = {f"p2c-{i}": f"ws://127.0.0.1:{7100 + i}" for i in range(4)}
        settings, store, watcher = await fleet(stack, redis_url, "test:p2c-spread", urls)
        await store.set_replicas("tara", 4)
        view = await watcher.wait_for(lambda v: v.replicas.get("tara") == 4, 5)
        owners = place(view, "tara", settings).owners
        picks = Counter(RingRouter(watcher, settings).pick("tara", {}, ()).id for _ in range(24))  # 24 gateways
        assert set(picks) <= set(owners) and len(picks) >= 2, picks


async def test_the_pools_own_opens_since_the_report_move_its_next_pick(redis_url):
    """A pool that just opened a stream on one of two owners sends the next to the other, though
    the reported loads (older than that open) are still equal."""
    async with AsyncExitStack() as stack:
        urls = {f"own-{i}": f"ws://127.0.0.1:{7200 + i}" for i in range(3)}
        settings, store, watcher = await fleet(stack, redis_url, "test:p2c-own", urls)
        await store.set_replicas("leo", 2)
        await watcher.wait_for(lambda v: v.replicas.get("leo") == 2, 5)
        router = RingRouter(watcher, settings)
        for _ in range(10):
            first = router.pick("leo", {}, ()).id
            second = router.pick("leo", {first: 1}, ()).id  # the pool holds one stream there now
            assert second != first


async def test_a_placed_start_is_served_where_it_lands_and_reported_as_a_spill(redis_url):
    """Regression (the needless hop): the gateway spilled on a stale load and the worker it
    spilled to relayed the start back to the owner the gateway had avoided."""
    async with AsyncExitStack() as stack:
        urls = {"hop-a": "ws://127.0.0.1:7301", "hop-b": "ws://127.0.0.1:7302"}
        settings, store, watcher = await fleet(stack, redis_url, "test:placed-hop", urls)
        owner = place(watcher.view, "tara", settings).owners[0]
        other = next(w for w in urls if w != owner)
        heat = HeatRecorder(ReplicaControl(store))  # not started: spills stay in memory here
        pool = await stack.enter_async_context(WorkerPool(RingRouter(watcher, settings)))
        here = Forwarder(other, watcher, settings, pool, heat)
        assert here.should_forward(Start("c1", "tara"))  # a caller that does not know the ring: relayed
        placed = Start("c2", "tara", placed=True)
        assert here.decide(placed) == "spill" and not here.should_forward(placed)  # the pool placed it: served here
        assert here.spills == 0  # counted only once admitted (the server calls `spilled` then)
        here.spilled(placed)
        assert here.spills == 1 and heat._spills == {"tara": 1}
        at_owner = Forwarder(owner, watcher, settings, pool, heat)
        assert not at_owner.should_forward(Start("c3", "tara", placed=True)) and at_owner.spills == 0


def test_placed_travels_on_the_wire_and_must_be_a_boolean():
    start = parse_client(encode(Start("c1", "tara", "Hi.", placed=True)))
    assert start.placed is True and parse_client(encode(Start("c2", "tara"))).placed is False
    with pytest.raises(Exception, match="placed"):
        parse_client(json.dumps({"type": "start", "context_id": "c3", "voice": "tara", "placed": "yes"}))


async def test_the_pool_marks_its_ring_placed_starts_and_a_static_pool_does_not(redis_url):
    seen: list[dict] = []

    async def handler(ws):
        async for raw in ws:
            message = json.loads(raw)
            seen.append(message)
            await ws.send(encode(Error("bad_request", "captured", False, message["context_id"])))

    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(serve(handler, "127.0.0.1", 0))
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        settings, store, watcher = await fleet(stack, redis_url, "test:placed-wire", {"wire-a": url})
        for pool in (WorkerPool(RingRouter(watcher, settings)), WorkerPool.static([url])):
            async with pool:
                stream = await pool.start("tara", "Hello.")
                with pytest.raises(WorkerRequestError):
                    async for _ in stream.audio():
                        pass
        assert [m["placed"] for m in seen if m["type"] == "start"] == [True, False]
