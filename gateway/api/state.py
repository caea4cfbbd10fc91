"""Everything one gateway process holds while it serves, opened and closed as one.

- Redis (the tenant layer's async client; an embedded server when no URL is configured), it and
  the ring store's client sized by `settings.redis_pool_size()`,
- the tenant layer: `Tenants` (keys, voices), `Quotas`, `Meter`, the `Catalog` of voice names and
  the tenants' `Pronunciations` dictionaries,
- the worker pool (`gpu_worker.client`): routed by the ring in Redis (`RingWatcher`), or over a
  fixed list of worker URLs, dialing with the cluster token,
- the training queue (lora_training's `JobQueue`, a sync client: called off the event loop),
- the bounded pool that decodes uploads for their checks (`gateway.cloning.DecodePool`),
- the metrics registry,
- the open text-in stream sockets, drained when the process stops (`gateway.api.drain`),
- the speech responses cut after their first audio, reported once per burst (`gateway.api.cuts`).

Routes reach it as `request.app.state.gateway`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from gateway.api.cuts import CutReport
from gateway.api.drain import StreamDrain
from gateway.api.metrics import GatewayMetrics
from gateway.catalog import Catalog
from gateway.cloning.decoding import DecodePool
from gateway.quotas import Quotas
from gateway.settings import GatewaySettings
from gateway.tenants import Tenants, connect_redis
from gateway.tenants.pronunciations import Pronunciations
from gateway.usage import Meter
from gpu_worker.client import PoolSettings, WorkerPool, ring_pool
from hashring.membership import RingWatcher
from hashring.presence import Announcer, default_id
from hashring.settings import RingSettings
from lora_training.jobs import JobQueue

__all__ = ["Gateway", "open_gateway"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Gateway:
    settings: GatewaySettings
    redis_url: str
    tenants: Tenants
    quotas: Quotas
    meter: Meter
    catalog: Catalog
    pool: WorkerPool
    watcher: RingWatcher | None
    jobs: JobQueue
    metrics: GatewayMetrics
    decodes: DecodePool
    pronunciations: Pronunciations
    streams: StreamDrain = field(default_factory=StreamDrain)  # open /v1/tts/stream sockets; drained at SIGTERM
    cuts: CutReport = field(default_factory=CutReport)  # speech responses cut after their first audio


@asynccontextmanager
async def open_gateway(settings: GatewaySettings) -> AsyncIterator[Gateway]:
    async with AsyncExitStack() as stack:
        redis_url = settings.redis_url
        if redis_url is None:
            from hashring.embedded import EmbeddedRedis

            embedded = stack.enter_context(EmbeddedRedis())
            redis_url = embedded.url
            log.warning("no Redis configured: using an embedded one at %s (tenants and keys are lost when the "
                        "gateway stops; set VOICERING_GATEWAY_REDIS_URL)", embedded.url)
        redis_pool = settings.redis_pool_size()  # each client's; a call waits redis_pool_wait_s for a free one
        redis = connect_redis(redis_url, timeout_s=settings.redis_timeout_s, max_connections=redis_pool,
                              pool_wait_s=settings.redis_pool_wait_s)
        stack.push_async_callback(redis.aclose)
        tenants = Tenants(redis, settings.tenant_prefix, auth_cache_s=settings.auth_cache_s)
        quotas = Quotas(redis, settings.tenant_prefix, stream_lease_s=settings.stream_lease_s)
        meter = Meter(redis, settings.tenant_prefix)
        pool_settings = PoolSettings(token=settings.cluster_token)
        watcher = None
        if settings.workers:
            pool = await stack.enter_async_context(WorkerPool.static(list(settings.workers), pool_settings))
        else:
            # +1: the ring watcher's subscription holds one connection for as long as it runs
            ring_settings = RingSettings(redis_url=redis_url, prefix=settings.ring_prefix,
                                         redis_max_connections=redis_pool + 1,
                                         redis_pool_wait_s=settings.redis_pool_wait_s)
            ring = await stack.enter_async_context(ring_pool(ring_settings, pool_settings))
            watcher, pool = ring.watcher, ring.pool
            # listed by `voicering status` (a static gateway, pinned to its --worker list, is not in the fleet)
            await stack.enter_async_context(Announcer(ring.store, "gateway", default_id(settings.port),
                                                      address=f"{settings.host}:{settings.port}"))
        jobs = JobQueue.connect(redis_url, settings.train_prefix, timeout_s=settings.train_timeout_s)
        stack.callback(jobs.close)
        catalog = Catalog(tenants, settings.base_voices, cache_s=settings.auth_cache_s)
        decodes = DecodePool(settings.max_concurrent_decodes, settings.max_decodes_per_tenant)
        stack.callback(decodes.close)
        gateway = Gateway(settings, redis_url, tenants, quotas, meter, catalog, pool, watcher, jobs, GatewayMetrics(),
                          decodes, Pronunciations(redis, settings.tenant_prefix))
        stack.callback(gateway.cuts.flush)  # a burst cut just before the stop is still said
        yield gateway
