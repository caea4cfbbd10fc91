"""gateway.usage against a real Redis: totals add up, even from many writers at once."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tenants import TenantError, Tenants, Unavailable, connect_redis
from gateway.usage import Meter, Usage

pytestmark = pytest.mark.timeout(60)




async def test_usage_sums_across_concurrent_writers(client, prefix, redis_url):
    tenant, _ = await Tenants(client, prefix).create("acme")
    other, _ = await Tenants(client, prefix).create("other")
    second = connect_redis(redis_url, timeout_s=0.5)
    meters = [Meter(client, prefix), Meter(second, prefix)]
    assert await meters[0].usage(tenant) == Usage()
    try:
        await asyncio.gather(*(meters[i % 2].add_usage(tenant, audio_seconds=0.25, requests=1) for i in range(60)))
        await meters[1].add_usage(tenant, training_minutes=12.5)
        await meters[1].add_usage(other, requests=2)
        await meters[0].add_usage(tenant)  # nothing to add
    finally:
        await second.aclose()
    assert await meters[0].usage(tenant) == Usage(audio_seconds=15.0, training_minutes=12.5, requests=60)
    assert await meters[0].usage(other) == Usage(requests=2)


@pytest.mark.parametrize("bad", [{"audio_seconds": -1.0}, {"training_minutes": float("nan")},
                                 {"requests": 1.5}, {"requests": True}, {"audio_seconds": float("inf")}])
async def test_bad_amounts_are_refused(client, prefix, bad):
    tenant, _ = await Tenants(client, prefix).create("acme")
    with pytest.raises(TenantError, match="usage"):
        await Meter(client, prefix).add_usage(tenant, **bad)
    assert await Meter(client, prefix).usage(tenant) == Usage()


async def test_redis_down_is_unavailable(redis_server, redis_url, prefix):
    client = connect_redis(redis_url, timeout_s=0.5)
    tenant, _ = await Tenants(client, prefix).create("acme")
    redis_server.stop()
    try:
        with pytest.raises(Unavailable):
            await Meter(client, prefix).add_usage(tenant, requests=1)
    finally:
        redis_server.start()
        await client.aclose()
