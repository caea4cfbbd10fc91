"""gateway.quotas against a real Redis: stream slots, requests per minute, training slots, Redis down."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gateway.quotas import Quotas
from gateway.tenants import QuotaExceeded, TenantError, TenantLimits, Tenants, Unavailable, connect_redis

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]





@pytest.fixture
def quotas(client, prefix) -> Quotas:
    return Quotas(client, prefix, stream_lease_s=0.6, request_window_s=1.0)


def renewers() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("stream-slot-renew:")]


# -- streams ------------------------------------------------------------------------------------------


async def test_stream_limit_holds_under_a_burst_from_two_gateways(tenants, quotas, redis_url, prefix):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=3))
    other_client = connect_redis(redis_url, timeout_s=0.5)
    other_gateway = Quotas(other_client, prefix, stream_lease_s=0.6)
    active = peak = 0

    async def speak(q: Quotas) -> bool:
        nonlocal active, peak
        try:
            async with q.stream_slot(tenant):
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0.3)
                active -= 1
            return True
        except QuotaExceeded as exc:
            assert exc.limit == "streams" and exc.retryable and exc.retry_after_s > 0
            assert "3 speech streams" in exc.message
            return False

    try:
        results = await asyncio.gather(*(speak(quotas if i % 2 else other_gateway) for i in range(24)))
    finally:
        await other_client.aclose()
    assert sum(results) == 3 and peak == 3
    assert await quotas.streams_in_use(tenant) == 0
    assert renewers() == []


async def test_slot_is_released_on_exit_exception_and_cancel(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=1))
    async with quotas.stream_slot(tenant) as slot:
        assert await quotas.streams_in_use(tenant) == 1
        assert renewers() == [f"stream-slot-renew:{tenant.id}"] and slot.tenant == tenant
        with pytest.raises(QuotaExceeded):
            async with quotas.stream_slot(tenant):
                pass
    assert await quotas.streams_in_use(tenant) == 0 and renewers() == []

    with pytest.raises(RuntimeError, match="boom"):
        async with quotas.stream_slot(tenant):
            raise RuntimeError("boom")
    assert await quotas.streams_in_use(tenant) == 0

    held = asyncio.Event()

    async def hold_forever() -> None:
        async with quotas.stream_slot(tenant):
            held.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(hold_forever())
    await held.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await quotas.streams_in_use(tenant) == 0 and renewers() == []


async def test_a_held_slot_outlives_its_lease_by_renewal(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=1))
    async with quotas.stream_slot(tenant):
        await asyncio.sleep(3 * quotas.stream_lease_s)
        assert await quotas.streams_in_use(tenant) == 1
        with pytest.raises(QuotaExceeded):
            async with quotas.stream_slot(tenant):
                pass
    assert await quotas.streams_in_use(tenant) == 0


HOLDER = textwrap.dedent("""
    import asyncio, sys
    from gateway.quotas import Quotas
    from gateway.tenants import Tenants, connect_redis

    async def main(url, prefix, tenant_id):
        client = connect_redis(url, timeout_s=1.0)
        tenant = await Tenants(client, prefix).get(tenant_id)
        async with Quotas(client, prefix, stream_lease_s=0.6).stream_slot(tenant):
            print("held", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(*sys.argv[1:]))
""")


async def test_a_killed_gateways_slot_lapses_after_the_lease(tenants, quotas, redis_url, prefix):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=1))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url, prefix, tenant.id], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        await asyncio.sleep(2 * quotas.stream_lease_s)  # it renews: still held past the lease
        with pytest.raises(QuotaExceeded):
            async with quotas.stream_slot(tenant):
                pass
        holder.kill()
        holder.wait(10)
        killed_at = time.monotonic()
        while True:
            try:
                async with quotas.stream_slot(tenant):
                    break
            except QuotaExceeded:
                assert time.monotonic() - killed_at < quotas.stream_lease_s + 1.0, "the dead slot never lapsed"
                await asyncio.sleep(0.05)
        assert time.monotonic() - killed_at > 0.05  # it lapsed, not freed
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()


# -- requests per minute ------------------------------------------------------------------------------


async def test_requests_per_window_and_retry_after(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(requests_per_minute=3))
    for _ in range(3):
        await quotas.count_request(tenant)
    with pytest.raises(QuotaExceeded) as err:
        await quotas.count_request(tenant)
    assert err.value.limit == "requests" and err.value.retryable
    assert 0 < err.value.retry_after_s <= quotas.request_window_s
    await asyncio.sleep(err.value.retry_after_s + 0.05)
    await quotas.count_request(tenant)  # the oldest request left the window


async def test_request_limit_holds_under_a_burst(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(requests_per_minute=5))

    async def one() -> bool:
        try:
            await quotas.count_request(tenant)
            return True
        except QuotaExceeded:
            return False

    assert sum(await asyncio.gather(*(one() for _ in range(30)))) == 5


async def test_the_real_window_is_a_minute(tenants, client, prefix):
    tenant, _ = await tenants.create("acme", TenantLimits(requests_per_minute=1))
    quotas = Quotas(client, prefix)
    await quotas.count_request(tenant)
    with pytest.raises(QuotaExceeded) as err:
        await quotas.count_request(tenant)
    assert 58 < err.value.retry_after_s <= 60 and "retry in" in err.value.message


# -- training -----------------------------------------------------------------------------------------


async def test_training_slots_by_job_id(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_training_jobs=2))
    await quotas.acquire_training_slot(tenant, "job-a")
    await quotas.acquire_training_slot(tenant, "job-b")
    await quotas.acquire_training_slot(tenant, "job-a")  # the same job again: still one slot
    with pytest.raises(QuotaExceeded) as err:
        await quotas.acquire_training_slot(tenant, "job-c")
    assert err.value.limit == "training_jobs" and not err.value.retryable
    assert await quotas.training_jobs(tenant) == {"job-a", "job-b"}
    assert await quotas.release_training_slot(tenant, "job-a")
    assert not await quotas.release_training_slot(tenant, "job-a")
    await quotas.acquire_training_slot(tenant, "job-c")
    assert await quotas.training_jobs(tenant) == {"job-b", "job-c"}
    with pytest.raises(TenantError, match="job id"):
        await quotas.acquire_training_slot(tenant, "")


async def test_training_limit_holds_under_a_burst(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_training_jobs=2))
    results = await asyncio.gather(*(quotas.acquire_training_slot(tenant, f"job-{i}") for i in range(20)),
                                   return_exceptions=True)
    assert sum(r is None for r in results) == 2 and len(await quotas.training_jobs(tenant)) == 2


# -- Redis down ---------------------------------------------------------------------------------------


async def test_redis_down_quotas_say_unavailable_and_exit_never_raises(redis_server, redis_url, prefix, caplog):
    client = connect_redis(redis_url, timeout_s=0.5)
    tenant, _ = await Tenants(client, prefix).create("acme")
    quotas = Quotas(client, prefix, stream_lease_s=0.6)
    try:
        async with quotas.stream_slot(tenant):
            redis_server.stop()
            await asyncio.sleep(0.3)  # a renewal fails meanwhile: logged, not raised
        assert any("could not free a stream slot" in r.getMessage() for r in caplog.records
                   if r.levelno >= logging.WARNING)
        with pytest.raises(Unavailable):
            await quotas.count_request(tenant)
        with pytest.raises(Unavailable):
            async with quotas.stream_slot(tenant):
                pass
        with pytest.raises(Unavailable):
            await quotas.acquire_training_slot(tenant, "job")
    finally:
        redis_server.start()
        await client.aclose()
