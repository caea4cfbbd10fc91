"""Per-tenant quotas that hold across every gateway process: they are counted in Redis.

- concurrent speech streams: `async with quotas.stream_slot(tenant):` holds one of `max_streams`
  slots, a sorted set of slot tokens scored by lease expiry. The holder renews its lease in the
  background; a gateway that dies stops renewing, and its slots lapse after `stream_lease_s`.
- requests per minute: `await quotas.count_request(tenant)`, a sliding window of request times.
- training jobs at once: `acquire_training_slot` / `release_training_slot` by job id (a set).
- bytes per upload: only a limit (`tenant.limits.max_upload_bytes`); the API enforces it while
  it streams the upload.

Every check-and-take is one Lua script on the Redis clock, so two gateways never both take the
last slot and their clocks need not agree. Limits come from the `Tenant` passed in (fresh from
`Tenants.authenticate`, so a `set_limits` applies to the tenant's next request).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Final

import redis.asyncio as aioredis

from gateway.tenants import (
    DEFAULT_PREFIX,
    Busy,
    KeyLayout,
    QuotaExceeded,
    Tenant,
    TenantError,
    Unavailable,
    check_job_id,
    redis_errors,
)

__all__ = ["DEFAULT_REQUEST_WINDOW_S", "DEFAULT_STREAM_LEASE_S", "STREAM_RETRY_AFTER_S", "Quotas", "StreamSlot"]

log = logging.getLogger(__name__)

DEFAULT_STREAM_LEASE_S: Final = 30.0
DEFAULT_REQUEST_WINDOW_S: Final = 60.0  # "per minute"; shorter only in tests
STREAM_RETRY_AFTER_S: Final = 1.0  # streams end at no known time: suggest a short wait

_NOW = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"
# KEYS: streams. ARGV: token, limit, lease_s. 1 taken, 0 full.
_ACQUIRE_STREAM = _NOW + """
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
return 1
"""
# KEYS: streams. ARGV: token, limit, lease_s. 1 renewed, 2 lapsed and taken again, 0 lapsed and full.
_RENEW_STREAM = _NOW + """
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
if held then return 1 end
return 2
"""
# KEYS: streams. Slots whose lease has not run out.
_COUNT_STREAMS = _NOW + "return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')\n"
# KEYS: requests. ARGV: token, limit, window_s. false when counted, else seconds until the window frees.
_COUNT_REQUEST = _NOW + """
local window = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000) + 1000)
return false
"""
# KEYS: training. ARGV: job id, limit. 1 held (again or newly), 0 full.
_ACQUIRE_TRAINING = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""


class Quotas:
    """Stream slots, the request window and training slots of every tenant. Share one per process."""

    def __init__(self, redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX, *,
                 stream_lease_s: float = DEFAULT_STREAM_LEASE_S,
                 request_window_s: float = DEFAULT_REQUEST_WINDOW_S) -> None:
        if stream_lease_s <= 0 or request_window_s <= 0:
            raise ValueError("stream_lease_s and request_window_s must be > 0")
        self.keys = KeyLayout(prefix)
        self.stream_lease_s = stream_lease_s
        self.request_window_s = request_window_s
        self._redis = redis
        script = redis.register_script
        self._acquire_stream, self._renew_stream = script(_ACQUIRE_STREAM), script(_RENEW_STREAM)
        self._count_streams, self._count_request = script(_COUNT_STREAMS), script(_COUNT_REQUEST)
        self._acquire_training = script(_ACQUIRE_TRAINING)

    # -- streams ------------------------------------------------------------------------------------

    def stream_slot(self, tenant: Tenant) -> StreamSlot:
        """`async with quotas.stream_slot(tenant):` one concurrent speech stream, or QuotaExceeded."""
        return StreamSlot(self, tenant)

    async def streams_in_use(self, tenant: Tenant) -> int:
        """Slots of the tenant whose lease has not run out."""
        with redis_errors():
            return int(await self._count_streams(keys=[self.keys.streams(tenant.id)]))

    async def _take_stream(self, tenant: Tenant, token: str) -> None:
        with redis_errors():
            taken = await self._acquire_stream(keys=[self.keys.streams(tenant.id)],
                                               args=[token, tenant.limits.max_streams, self.stream_lease_s])
        if not taken:
            raise QuotaExceeded(
                f"tenant {tenant.name!r} already has {tenant.limits.max_streams} speech streams open, its limit; "
                f"end one or retry in {STREAM_RETRY_AFTER_S:g}s", limit="streams", retry_after_s=STREAM_RETRY_AFTER_S)

    async def _renew(self, tenant: Tenant, token: str) -> int:
        with redis_errors():
            return int(await self._renew_stream(keys=[self.keys.streams(tenant.id)],
                                                args=[token, tenant.limits.max_streams, self.stream_lease_s]))

    async def _release_stream(self, tenant: Tenant, token: str) -> None:
        with redis_errors():
            await self._redis.zrem(self.keys.streams(tenant.id), token)

    # -- requests -----------------------------------------------------------------------------------

    async def count_request(self, tenant: Tenant) -> None:
        """Count one request against `requests_per_minute`, or QuotaExceeded (not counted) with the
        seconds until the oldest request in the window leaves it."""
        with redis_errors():
            wait = await self._count_request(keys=[self.keys.requests(tenant.id)],
                                             args=[secrets.token_hex(8), tenant.limits.requests_per_minute,
                                                   self.request_window_s])
        if wait is not None:
            retry = max(0.001, float(wait))
            raise QuotaExceeded(
                f"tenant {tenant.name!r} made {tenant.limits.requests_per_minute} requests in the last "
                f"{self.request_window_s:g}s, its limit; retry in {retry:.1f}s", limit="requests", retry_after_s=retry)

    # -- training -----------------------------------------------------------------------------------

    async def acquire_training_slot(self, tenant: Tenant, job_id: str) -> None:
        """Let job `job_id` train (idempotent for a job already holding a slot), or QuotaExceeded."""
        check_job_id(job_id)
        with redis_errors():
            held = await self._acquire_training(keys=[self.keys.training(tenant.id)],
                                                args=[job_id, tenant.limits.max_training_jobs])
        if not held:
            raise _training_full(tenant)

    async def check_training_slot(self, tenant: Tenant) -> None:
        """QuotaExceeded if the tenant has no training slot free now (a check, nothing taken: the
        cheap refusal before work that `acquire_training_slot` then takes atomically)."""
        with redis_errors():
            held = await self._redis.scard(self.keys.training(tenant.id))
        if held >= tenant.limits.max_training_jobs:
            raise _training_full(tenant)

    async def release_training_slot(self, tenant: Tenant, job_id: str) -> bool:
        """Free the slot of job `job_id` (finished, failed or cancelled); False if it held none."""
        with redis_errors():
            return bool(await self._redis.srem(self.keys.training(tenant.id), job_id))

    async def training_jobs(self, tenant: Tenant) -> frozenset[str]:
        """Job ids holding a training slot of the tenant."""
        with redis_errors():
            return frozenset(await self._redis.smembers(self.keys.training(tenant.id)))


def _training_full(tenant: Tenant) -> QuotaExceeded:
    return QuotaExceeded(f"tenant {tenant.name!r} already has {tenant.limits.max_training_jobs} training jobs running, "
                         "its limit; wait for one to finish", limit="training_jobs")


class StreamSlot:
    """One held stream slot. Entering takes it (or raises QuotaExceeded / Unavailable); while held, a
    named task renews its lease every third of it; leaving cancels that task and frees the slot.
    If Redis is away at the exit, the slot is not freed and lapses after the lease."""

    def __init__(self, quotas: Quotas, tenant: Tenant) -> None:
        self._quotas = quotas
        self.tenant = tenant
        self.token = secrets.token_hex(12)
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StreamSlot:
        if self._renewer is not None:
            raise RuntimeError("a StreamSlot is entered once")
        await self._quotas._take_stream(self.tenant, self.token)
        self._renewer = asyncio.create_task(self._renew_forever(), name=f"stream-slot-renew:{self.tenant.id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.wait([self._renewer])  # unlike `await task`, keeps a cancel of our own caller
        try:
            await self._quotas._release_stream(self.tenant, self.token)
        except TenantError as err:  # never mask the stream's own outcome; the lease frees the slot
            log.warning("could not free a stream slot of tenant %s (%s); it lapses in %gs",
                        self.tenant.id, err.message, self._quotas.stream_lease_s)

    async def _renew_forever(self) -> None:
        interval = self._quotas.stream_lease_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                outcome = await self._quotas._renew(self.tenant, self.token)
            except (Unavailable, Busy) as err:
                log.warning("could not renew a stream slot of tenant %s (%s); retrying", self.tenant.id, err.message)
                continue
            except TenantError as err:
                log.error("renewing a stream slot of tenant %s failed: %s", self.tenant.id, err.message)
                continue
            if outcome == 0:
                log.warning("a stream slot of tenant %s lapsed and the tenant is at its limit; the stream "
                            "goes on uncounted", self.tenant.id)
            elif outcome == 2:
                log.info("a stream slot of tenant %s lapsed (Redis was away) and was taken again", self.tenant.id)
