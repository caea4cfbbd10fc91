"""hashring: the consistent hash ring that places every voice on GPU workers (see README.md).

The package root exports the names other packages use; it imports no Redis client, so the pure
ring stays cheap to import. Redis-backed parts: `hashring.store`, `hashring.membership`,
`hashring.placement`.
"""

from hashring.errors import (
    EmptyRing,
    InvalidReplicas,
    InvalidVoiceId,
    InvalidWorkerId,
    RingError,
    RingUnavailable,
    UnknownWorker,
)
from hashring.ring import DEFAULT_BALANCE, DEFAULT_VNODES, SEED, Node, Ring, hash_key
from hashring.settings import REDIS_URL_ENV, RetryPolicy, RingSettings

__all__ = [
    "DEFAULT_BALANCE",
    "DEFAULT_VNODES",
    "REDIS_URL_ENV",
    "SEED",
    "EmptyRing",
    "InvalidReplicas",
    "InvalidVoiceId",
    "InvalidWorkerId",
    "Node",
    "RetryPolicy",
    "Ring",
    "RingError",
    "RingSettings",
    "RingUnavailable",
    "UnknownWorker",
    "hash_key",
]
