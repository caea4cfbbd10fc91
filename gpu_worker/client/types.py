"""The worker pool's public values: its settings, what it reports, and its errors. Every pool
module imports these; they import nothing of the pool.

Errors (all `WorkerRequestError`, so callers handle one type; `.error.code`, `.retryable`):

    WorkerRequestError      the worker's own error for the context (client.py)
    ├── WorkerLost          worker_lost: the connection dropped after audio was relayed
    └── NoWorkerAvailable   no_worker (retryable): every candidate was tried, ejected or full
        └── NoWorkerServing no_worker (retryable): the ring has no live, undrained worker at all
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpu_worker.client.connection import WorkerRequestError
from gpu_worker.client.ejection import EjectionPolicy
from gpu_worker.protocol import MAX_MESSAGE_BYTES, Error

__all__ = ["NoWorkerAvailable", "NoWorkerServing", "PeerStats", "PoolSettings", "RoutingStats", "WorkerLost"]


class WorkerLost(WorkerRequestError):
    """The connection to the worker dropped after audio of this context reached the caller."""

    def __init__(self, context_id: str, worker_id: str) -> None:
        super().__init__(Error("worker_lost", f"connection to worker {worker_id} was lost mid-context, after audio "
                                              "was relayed; the context cannot be resumed", False, context_id))


class NoWorkerAvailable(WorkerRequestError):
    """No worker could take the context: all were tried, ejected or full. Retry shortly."""

    def __init__(self, message: str, context_id: str | None = None) -> None:
        super().__init__(Error("no_worker", message, True, context_id))


class NoWorkerServing(NoWorkerAvailable):
    """No worker is in the ring at all (every one draining, or none joined yet): not a full fleet,
    an empty one. Retry shortly; an operator should look."""


@dataclass(frozen=True, slots=True)
class PoolSettings:
    open_timeout_s: float = 5.0  # TCP connect + websocket handshake
    max_connection_age_s: float = 600.0  # older connections take no new contexts
    max_connections_per_peer: int = 4
    max_attempts: int = 4  # failed tries per context (workers or connections), the first included; `busy` is not one
    max_refusals: int = 6  # `busy` answers per context before it gives up with the last one
    reconnect_base_s: float = 0.1  # failed dials back off: base × 2**(n-1), capped, ±20 % jitter
    reconnect_max_s: float = 5.0
    consecutive_errors: int = 5  # failures on open connections that eject a worker
    ejection_base_s: float = 30.0  # × ejection count
    ejection_max_s: float = 300.0
    max_ejected_share: float = 0.1  # of the workers known to the router; at least one
    max_message_bytes: int = 1 << 22  # the largest message taken from a worker
    peer_max_message_bytes: int = MAX_MESSAGE_BYTES  # the largest a worker takes: bigger ones are refused unsent
    first_audio_timeout_s: float | None = 30.0  # after a flush or end, the longest wait for a context's first audio
    stall_timeout_s: float | None = 30.0  # after the first audio, the longest gap while the worker owes audio
    address: Literal["ws_url", "proxy_url"] = "ws_url"  # which registered address to dial (workers use proxy_url)
    token: str | None = None  # the cluster token, sent as `Authorization: Bearer` on every dial

    def __post_init__(self) -> None:
        if self.max_connections_per_peer < 1 or self.max_attempts < 1 or self.consecutive_errors < 1:
            raise ValueError("max_connections_per_peer, max_attempts and consecutive_errors must be >= 1")
        if self.max_refusals < 0:
            raise ValueError("max_refusals must be >= 0")
        if not 0 < self.max_ejected_share <= 1:
            raise ValueError("max_ejected_share must be in (0, 1]")
        if self.peer_max_message_bytes < 1:
            raise ValueError("peer_max_message_bytes must be >= 1")
        for name in ("first_audio_timeout_s", "stall_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (or None: wait as long as it takes)")

    @property
    def ejection(self) -> EjectionPolicy:
        return EjectionPolicy(self.consecutive_errors, self.ejection_base_s, self.ejection_max_s, self.max_ejected_share)


@dataclass(frozen=True, slots=True)
class PeerStats:
    dials: int  # connection attempts, successful or not
    links: int  # connections open now
    links_opened: int  # connections opened over the pool's life
    streams: int  # contexts open there now
    errors: int  # consecutive failures on open connections
    ejections: int  # the current ejection count (sets the length of the next one)
    ejection_s: float  # length of the latest ejection
    ejected_for_s: float  # left of the current ejection, 0 when not ejected
    version: int  # the protocol version its newest connection answered (1 before negotiation; 0: never connected)


@dataclass(frozen=True, slots=True)
class RoutingStats:
    """What the pool's routing did since the pool was made (monotonic counters, for benches)."""

    starts: int  # starts sent to workers (every try; placed ones when the router places)
    opened: int  # tries a worker took (`opened`, or on a version-1 link its first audio or `done`)
    refusals: int  # `busy` answers
    spills: int  # opened outside the voice's owners
    insisted: int  # starts sent with `insist` (the last try after refusals)
