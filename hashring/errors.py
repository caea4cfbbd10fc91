"""Errors raised by hashring.

    RingError                 every error below; `.retryable` says whether trying again can help
    ├── RingUnavailable       Redis cannot be reached or timed out (retryable)
    │   └── RingBusy          every pooled connection of this process stayed in use past the pool's
    │                         wait: this process is busy, Redis may be fine (retryable)
    ├── EmptyRing             no live, undrained worker to place a voice on (retryable)
    ├── UnknownWorker         an operator named a worker that never registered
    ├── InvalidWorkerId       a worker id that is empty, too long or has odd characters
    ├── InvalidVoiceId        a voice id that is empty, too long or not valid UTF-8
    └── InvalidReplicas       a replica count below 1 or above the hard limit

Library errors (redis-py's MaxConnectionsError, ConnectionError, TimeoutError, OSError) are mapped to these at the
Redis boundary in `hashring.store`; nothing above the store sees a redis-py exception. Messages
are written for the operator reading them and never contain a Redis password.
"""

from __future__ import annotations

__all__ = [
    "EmptyRing",
    "InvalidReplicas",
    "InvalidVoiceId",
    "InvalidWorkerId",
    "RingBusy",
    "RingError",
    "RingUnavailable",
    "UnknownWorker",
]


class RingError(Exception):
    """Base of every hashring error."""

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable


class RingUnavailable(RingError):
    """Redis is unreachable; readers keep serving their last ring, writers retry with backoff."""

    retryable = True


class RingBusy(RingUnavailable):
    """This process's Redis connections were all in use for longer than its pool waits
    (`RingSettings.redis_max_connections`, `redis_pool_wait_s`); handled as any "not now", but
    it says so, not that Redis is unreachable."""


class EmptyRing(RingError):
    """No worker can take a voice right now (none live, all draining, or all excluded)."""

    retryable = True


class UnknownWorker(RingError):
    """An operator command named a worker that is not registered."""


class InvalidWorkerId(RingError):
    """A worker id that cannot be used."""


class InvalidVoiceId(RingError):
    """A voice id that cannot be hashed or stored."""


class InvalidReplicas(RingError):
    """A replica count outside [1, MAX_REPLICAS]."""
