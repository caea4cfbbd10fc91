"""Settings for everything in hashring that talks to Redis; built once per process, passed in."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from hashring.ring import DEFAULT_BALANCE, DEFAULT_VNODES

__all__ = ["REDIS_URL_ENV", "RetryPolicy", "RingSettings"]

REDIS_URL_ENV: Final = "VOICERING_REDIS_URL"
_DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff for writers: delay = min(max_delay_s, base_delay_s × 2**attempt)."""

    attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delay(self, attempt: int) -> float:
        return min(self.max_delay_s, self.base_delay_s * (2**attempt))


@dataclass(frozen=True, slots=True)
class RingSettings:
    """Ring, membership and placement settings. Every process of a fleet must agree on `prefix`,
    `vnodes` and the replica settings, or they will disagree on owners."""

    redis_url: str = _DEFAULT_REDIS_URL
    prefix: str = "voicering:ring"  # every Redis key starts with this
    vnodes: int = DEFAULT_VNODES
    balance: float = DEFAULT_BALANCE  # c in "load <= c × average"
    # membership
    heartbeat_interval_s: float = 1.0
    heartbeat_ttl_s: float = 5.0  # a worker silent this long is out of the ring
    forget_after_s: float = 3600.0  # a dead worker's record is deleted after this long
    refresh_interval_s: float = 2.0  # readers re-read the ring at least this often
    redis_timeout_s: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # placement
    default_replicas: int = 1
    hot_rate_per_replica: float = 5.0  # requests/s one replica of a voice takes before another is added
    cool_factor: float = 0.7  # lower the replica count only once the rate is under cool_factor × that
    max_auto_replicas: int = 8
    heat_half_life_s: float = 60.0  # the request-rate counter halves every this many seconds

    def __post_init__(self) -> None:
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_ttl_s must be longer than heartbeat_interval_s")
        if self.balance < 1:
            raise ValueError("balance must be >= 1")
        if not (0 < self.cool_factor <= 1):
            raise ValueError("cool_factor must be in (0, 1]")
        if self.default_replicas < 1 or self.max_auto_replicas < 1:
            raise ValueError("replica settings must be >= 1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> RingSettings:
        """Settings with the Redis URL taken from VOICERING_REDIS_URL (read here, once)."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        if env.get(REDIS_URL_ENV):
            values["redis_url"] = env[REDIS_URL_ENV]
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
