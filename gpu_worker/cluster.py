"""The worker as a member of the fleet: registered and heartbeating in the ring, watching it, and
holding the pool its proxy uses to reach voice owners (dialing their internal address with the
cluster token). While it serves it also prewarms the voices it newly owns whenever placement
changes (`ownership.OwnershipWarmer`), counts requests per voice for automatic replicas
(`HeatRecorder`, batched off the request path) and takes its turn cooling replica counts
(`CoolLoop`, one worker of the fleet at a time under a Redis lease). Also the graceful drain:
marked draining at once (no placement includes it, so new starts go to other owners and any it
still receives are relayed), active streams get a grace period, then it leaves the ring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from gpu_worker.adapters import AdapterCache
from gpu_worker.placement_prewarm import OwnershipWarmer, heat_rates
from gpu_worker.client import PoolSettings, WorkerPool, ring_pool
from gpu_worker.proxy import Forwarder
from gpu_worker.settings import WorkerSettings
from hashring.errors import RingError
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import CoolLoop, HeatRecorder, ReplicaControl
from hashring.records import WorkerInfo
from hashring.settings import RingSettings
from hashring.store import RingStore

log = logging.getLogger(__name__)

# How long a draining worker tries to mark itself draining in Redis (the writer's retries included)
# before it goes on without: a dead Redis must not eat the grace its streams need.
DRAIN_MARK_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Cluster:
    store: RingStore
    heartbeat: Heartbeat
    watcher: RingWatcher
    pool: WorkerPool
    forwarder: Forwarder
    ring_settings: RingSettings
    warmer: OwnershipWarmer | None
    heat: HeatRecorder
    cooler: CoolLoop


def worker_info(settings: WorkerSettings) -> WorkerInfo:
    url = settings.advertise_url or f"ws://{settings.host}:{settings.port}"
    return WorkerInfo(settings.worker_id, url, settings.internal_url or url, capacity=settings.max_streams)


@asynccontextmanager
async def join_cluster(settings: WorkerSettings, load: Callable[[], int],
                       adapters: AdapterCache | None = None) -> AsyncIterator[Cluster | None]:
    """Join the ring while serving (None without Redis: a lone worker serves every voice itself).
    ``adapters``: prewarmed for the voices this worker newly owns (None: no placement prewarm)."""
    if not settings.redis_url:
        yield None
        return
    ring_settings = RingSettings.from_env(redis_url=settings.redis_url, prefix=settings.ring_prefix)  # + cadence
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        heartbeat = await stack.enter_async_context(Heartbeat(
            store, worker_info(settings), load=load, resident=None if adapters is None else lambda: adapters.resident))
        ring = await stack.enter_async_context(ring_pool(
            ring_settings, PoolSettings(address="proxy_url", token=settings.cluster_token,
                                        # the inner hop stalls out before the caller's pool (30 s) does
                                        stall_timeout_s=settings.relay_timeout_s), store=store))
        watcher, pool = ring.watcher, ring.pool
        warmer = None
        if adapters is not None and settings.ring_prewarm_max != 0:
            cap = settings.ring_prewarm_max or max(1, adapters.capacity // 2)  # never flush what it serves now
            warmer = await stack.enter_async_context(OwnershipWarmer(
                settings.worker_id, watcher, ring_settings, adapters.prewarm, adapters.store.voices,
                max_per_change=cap, rates=heat_rates(store), concurrency=settings.ring_prewarm_concurrency))
        control = ReplicaControl(store)
        cooler = await stack.enter_async_context(CoolLoop(control, interval_s=settings.ring_cool_interval_s))
        heat = await stack.enter_async_context(HeatRecorder(control, flush_interval_s=settings.ring_heat_flush_s))
        log.info("worker %s joined the hash ring", settings.worker_id)
        yield Cluster(store, heartbeat, watcher, pool, Forwarder(settings.worker_id, watcher, ring_settings, pool, heat,
                                                                first_audio_timeout_s=settings.relay_timeout_s),
                      ring_settings, warmer, heat, cooler)


async def drain(cluster: Cluster, streams: Callable[[], int], grace_s: float) -> int:
    """Mark this worker draining, then wait up to ``grace_s`` for its streams to end; returns how many
    were still running when the grace period ran out (they are cancelled by the shutdown).

    Never raises for Redis: its own view drops this worker at once whatever Redis says (so new
    starts that reach it are relayed), the mark in Redis is tried for at most
    ``DRAIN_MARK_TIMEOUT_S``, and if Redis is unreachable the other routers see this worker leave
    when its heartbeat stops. The grace period runs from the call, marking included."""
    deadline = time.monotonic() + grace_s
    wid = cluster.heartbeat.info.id
    await cluster.watcher.withhold(wid)
    try:
        async with asyncio.timeout(DRAIN_MARK_TIMEOUT_S):
            await cluster.heartbeat.set_draining(True)
            await cluster.watcher.refresh()
    except (RingError, TimeoutError) as exc:  # Redis away: the ring drops this worker when its heartbeat stops
        why = exc.message if isinstance(exc, RingError) else f"no answer within {DRAIN_MARK_TIMEOUT_S:.0f} s"
        log.warning("could not mark worker %s draining in Redis (%s); its own routing already avoids it, and "
                    "the others drop it when its heartbeat stops", wid, why)
    while (left := streams()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    log.info("drained: %d stream(s) still running after the %.0f s grace period", left, grace_s,
             extra={"left": left})
    return left
