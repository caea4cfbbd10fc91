"""The client side of the worker protocol: what the gateway, the LiveKit plugin, the trainer's
publish step and the worker's own relay use to reach workers. Nothing here imports torch or vLLM.

    connection.py  WorkerClient: one websocket to one worker, many contexts (ContextStream)
    pool.py        WorkerPool: a ring-aware pool of shared connections (start/say/prewarm)
    stream.py      PoolStream: one context through the pool, its refusals and retries
    links.py       the table of workers and websockets the pool dials and reads
    ejection.py    outlier ejection, a pure policy
    routers.py     where a context may go (RingRouter, StaticRouter)
    ring.py        RingPool: the chain store -> watcher -> router -> pool, built once
    types.py       PoolSettings, PeerStats, RoutingStats and the pool's errors

Imports run downward only (ring -> pool -> stream -> links -> ejection, routers, types ->
connection); callers outside this folder import from `gpu_worker.client` itself.
"""

from gpu_worker.client.connection import (MAX_CONNECTION_ERRORS, ContextStream, Speech, WorkerClient,
                                          WorkerConnectionLost, WorkerRequestError, collect)
from gpu_worker.client.ejection import EjectionPolicy, Health
from gpu_worker.client.pool import WorkerPool
from gpu_worker.client.ring import RingPool, ring_pool
from gpu_worker.client.routers import RingRouter, Router, StaticRouter
from gpu_worker.client.stream import PoolStream
from gpu_worker.client.types import NoWorkerAvailable, NoWorkerServing, PeerStats, PoolSettings, RoutingStats, WorkerLost

__all__ = ["MAX_CONNECTION_ERRORS", "ContextStream", "EjectionPolicy", "Health", "NoWorkerAvailable", "NoWorkerServing",
           "PeerStats", "PoolSettings", "PoolStream", "RingPool", "RingRouter", "Router", "RoutingStats", "Speech",
           "StaticRouter", "WorkerClient", "WorkerConnectionLost", "WorkerLost", "WorkerPool", "WorkerRequestError",
           "collect", "ring_pool"]
