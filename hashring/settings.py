"""Settings for everything in hashring that talks to Redis; built once per process, passed in."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from hashring.ring import DEFAULT_BALANCE, DEFAULT_VNODES

__all__ = ["ADMIT_FACTOR_ENV", "HEARTBEAT_ENV", "REDIS_URL_ENV", "REFRESH_ENV", "SHARE_FLOOR_ENV", "RetryPolicy", "RingSettings"]

REDIS_URL_ENV: Final = "VOICERING_REDIS_URL"
HEARTBEAT_ENV: Final = "VOICERING_RING_HEARTBEAT_INTERVAL_S"  # RingSettings.heartbeat_interval_s
REFRESH_ENV: Final = "VOICERING_RING_REFRESH_INTERVAL_S"  # RingSettings.refresh_interval_s
ADMIT_FACTOR_ENV: Final = "VOICERING_RING_ADMIT_FACTOR"  # RingSettings.admit_factor
SHARE_FLOOR_ENV: Final = "VOICERING_RING_SHARE_FLOOR"  # RingSettings.share_floor
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
    heartbeat_interval_s: float = 0.25  # how often a worker reports its load (routers' loads are this much older)
    heartbeat_ttl_s: float = 5.0  # a worker silent this long is out of the ring
    forget_after_s: float = 3600.0  # a dead worker's record is deleted after this long
    refresh_interval_s: float = 0.5  # readers re-read the ring (and the loads) at least this often
    redis_timeout_s: float = 1.0
    # this process's pool: at most this many connections, a call waits this long for a free one
    # (then RingBusy: this process is busier than its pool, not Redis unreachable)
    redis_max_connections: int = 32
    redis_pool_wait_s: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # placement
    default_replicas: int = 1
    # replicas(v) = ceil(rate(v) × mean_stream_s / max(headroom × mean_streams_per_worker, min_replica_streams)),
    # clamped to [1, min(live workers, max_auto_replicas)]; see hashring/sizing.py
    replica_headroom: float = 0.375  # α: the share of a mean worker's streams one replica of a voice may carry
    min_replica_streams: float = 1.0  # a voice gets a second replica only above this many concurrent streams
    cool_factor: float = 0.7  # lower the replica count only once the count for rate / cool_factor is lower
    max_auto_replicas: int = 256  # a safety limit; the live workers are the real clamp
    heat_half_life_s: float = 60.0  # slow window: the request-rate counter halves every this many seconds (scale down)
    heat_fast_half_life_s: float = 5.0  # short window (scale up)
    scale_down_hold_s: float = 60.0  # no lowering of a voice the cool loop raised less than this long ago
    # admission: a worker refuses a start when in_flight + 1 > min(capacity, ceil(admit_factor × fleet mean))
    admit_factor: float = 1.35  # how far above the fleet's mean load one worker may go before it refuses
    # ...but never below this share of its own capacity: a worker with half its slots free has room, and
    # in a burst its view of the others (their last heartbeats) is too old to say it holds too much
    share_floor: float = 0.5

    def __post_init__(self) -> None:
        if self.heartbeat_interval_s <= 0 or self.refresh_interval_s <= 0:
            raise ValueError("heartbeat_interval_s and refresh_interval_s must be > 0")
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_ttl_s must be longer than heartbeat_interval_s")
        if self.redis_max_connections < 1 or not self.redis_pool_wait_s > 0:
            raise ValueError("redis_max_connections must be >= 1 and redis_pool_wait_s > 0")
        if self.balance < 1:
            raise ValueError("balance must be >= 1")
        if not (0 < self.cool_factor <= 1):
            raise ValueError("cool_factor must be in (0, 1]")
        if self.default_replicas < 1 or self.max_auto_replicas < 1:
            raise ValueError("replica settings must be >= 1")
        if not (0 < self.replica_headroom <= 1) or self.min_replica_streams <= 0:
            raise ValueError("replica_headroom must be in (0, 1] and min_replica_streams > 0")
        if not (0 < self.heat_fast_half_life_s <= self.heat_half_life_s):
            raise ValueError("heat_fast_half_life_s must be > 0 and at most heat_half_life_s")
        if not self.admit_factor > 1:  # at 1 or below, a fleet at its mean refuses everything
            raise ValueError(f"admit_factor must be > 1, got {self.admit_factor}")
        if not 0 <= self.share_floor <= 1:
            raise ValueError(f"share_floor must be in [0, 1], got {self.share_floor}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> RingSettings:
        """Settings with the Redis URL taken from VOICERING_REDIS_URL, the membership cadence from
        VOICERING_RING_HEARTBEAT_INTERVAL_S / VOICERING_RING_REFRESH_INTERVAL_S and the admission
        factor and floor from VOICERING_RING_ADMIT_FACTOR / VOICERING_RING_SHARE_FLOOR (read here, once); `overrides` win over the environment."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        if env.get(REDIS_URL_ENV):
            values["redis_url"] = env[REDIS_URL_ENV]
        for name, key, what in (("heartbeat_interval_s", HEARTBEAT_ENV, "a number of seconds"),
                                ("refresh_interval_s", REFRESH_ENV, "a number of seconds"),
                                ("admit_factor", ADMIT_FACTOR_ENV, "a number above 1"),
                                ("share_floor", SHARE_FLOOR_ENV, "a number from 0 to 1")):
            if env.get(key):
                try:
                    values[name] = float(env[key])
                except ValueError:
                    raise ValueError(f"{key} must be {what}, got {env[key]!r}") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
