"""The chain every ring-aware caller builds: a Redis store -> a ring watcher -> a ring router -> a
worker pool. The gateway, the LiveKit plugin's transport and the worker's relay each built it by
hand; `ring_pool` builds it once, and `RingPool` closes it in the reverse order.

    async with ring_pool(ring_settings, PoolSettings(token=...)) as ring:
        stream = await ring.pool.start("tara", "Hello.")

A caller that already holds a store (the worker heartbeats through it first) passes it in and
keeps it: `RingPool` closes only what it opened.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_worker.client.pool import WorkerPool
from gpu_worker.client.routers import RingRouter
from gpu_worker.client.types import PoolSettings
from hashring.membership import RingWatcher
from hashring.settings import RingSettings
from hashring.store import RingStore

__all__ = ["RingPool", "ring_pool"]


@dataclass(slots=True, eq=False)
class RingPool:
    """A pool routed by the ring, with the store and watcher it reads. `start()` reads the ring
    (raises hashring's `RingError` while Redis is down; call it again later); `aclose()` closes the
    pool, the watcher, and the store when this chain opened it."""

    store: RingStore
    watcher: RingWatcher
    pool: WorkerPool
    owns_store: bool

    async def start(self) -> None:
        await self.watcher.start()

    async def aclose(self) -> None:
        try:
            await self.pool.aclose()
            await self.watcher.aclose()
        finally:
            if self.owns_store:
                await self.store.aclose()

    async def __aenter__(self) -> RingPool:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def ring_pool(ring_settings: RingSettings, pool_settings: PoolSettings | None = None, *,
              store: RingStore | None = None) -> RingPool:
    """The chain, not yet started (enter it, or call `start`): a store of its own unless one is given."""
    owned = store is None
    store = RingStore(ring_settings) if store is None else store
    watcher = RingWatcher(store)
    return RingPool(store, watcher, WorkerPool(RingRouter(watcher, ring_settings), pool_settings), owned)
