"""Usage metering: running totals per tenant (audio spoken, training time, requests), in Redis.

Counters only grow; they are what billing and `voicering tenant` read. Adding is one atomic
HINCRBYFLOAT per counter in a MULTI, so several gateway processes can meter one tenant at once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import redis.asyncio as aioredis

from gateway.tenants import DEFAULT_PREFIX, KeyLayout, Tenant, TenantError, redis_errors

__all__ = ["Meter", "Usage"]


@dataclass(frozen=True, slots=True)
class Usage:
    """A tenant's totals since it was created."""

    audio_seconds: float = 0.0  # speech delivered
    training_minutes: float = 0.0  # wall-clock minutes of its training jobs
    requests: int = 0  # API requests counted


_FIELDS = tuple(f.name for f in dataclasses.fields(Usage))


class Meter:
    """Adds to and reads the usage totals of every tenant. Share one per process."""

    def __init__(self, redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.keys = KeyLayout(prefix)
        self._redis = redis

    async def add_usage(self, tenant: Tenant, *, audio_seconds: float = 0.0, training_minutes: float = 0.0,
                        requests: int = 0) -> None:
        """Add to the tenant's totals; each amount must be finite and >= 0 (zero ones are skipped)."""
        amounts = {"audio_seconds": audio_seconds, "training_minutes": training_minutes, "requests": requests}
        for name, amount in amounts.items():
            number = isinstance(amount, int | float) and not isinstance(amount, bool)
            if not number or not math.isfinite(amount) or amount < 0:
                raise TenantError(f"usage {name} must be a finite number >= 0, not {amount!r}")
        if isinstance(requests, float) and not requests.is_integer():
            raise TenantError(f"usage requests must be a whole number, not {requests!r}")
        key = self.keys.usage(tenant.id)
        with redis_errors():
            async with self._redis.pipeline(transaction=True) as pipe:
                for name, amount in amounts.items():
                    if amount:
                        pipe.hincrbyfloat(key, name, amount)
                if len(pipe):
                    await pipe.execute()

    async def usage(self, tenant: Tenant) -> Usage:
        """The tenant's totals (zeros for a tenant that used nothing yet)."""
        with redis_errors():
            raw = await self._redis.hmget(self.keys.usage(tenant.id), _FIELDS)
        audio, training, requests = (float(v) if v is not None else 0.0 for v in raw)
        return Usage(audio, training, round(requests))
