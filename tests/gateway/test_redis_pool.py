"""The gateway's Redis clients under a burst (issue 33 item 3), on real gateway processes, a real
Redis and a real Sentinel.

redis-py's pool raises `MaxConnectionsError` the moment its 100 connections are in use, and the
tenant layer reported it as "the tenant store (Redis) is unreachable": at 200 speech requests at
once, requests were refused while Redis was idle. Now each client holds at most
`redis_pool_size()` connections and a call that finds none free waits up to `redis_pool_wait_s`
for one; past that the request gets 503 `gateway_busy` with Retry-After, in words that blame the
gateway's load, never Redis. The same holds through a `redis+sentinel://` URL.

A burst far above a tiny pool (4 connections) is served whole and opens no more than the pools
allow (how long requests took is printed); with the wait made tiny (1 connection, 5 ms), what
cannot get a connection in time is refused as busy, retryable, and the gateway serves on.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import psutil
import pytest

from tests.fixtures.gateway import start_gateway
from tests.hashring.test_failover import sentinel_watching

pytestmark = pytest.mark.timeout(300)

BURST = 300  # requests at once, each 3 Redis calls (key, request window, usage): ~75 per pooled connection


def pooled_gateway(redis_url: str, voices, folder, size: int, wait_s: float):
    return start_gateway(redis_url, voices, folder, env={"VOICERING_GATEWAY_REDIS_MAX_CONNECTIONS": str(size),
                                                         "VOICERING_GATEWAY_REDIS_POOL_WAIT_S": str(wait_s)})


async def burst(url: str, key: str, n: int = BURST) -> list[tuple[int, float, dict]]:
    """`n` GET /v1/usage at once, each on its own connection: (status, seconds, error object or {})."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        async def one() -> tuple[int, float, dict]:
            began = time.perf_counter()
            response = await http.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {key}"})
            took = time.perf_counter() - began
            error = response.json().get("error", {}) if response.status_code != 200 else {}
            if response.status_code == 503:
                error["retry_after"] = response.headers.get("retry-after")
            return response.status_code, took, error

        return await asyncio.gather(*(one() for _ in range(n)))


def report(label: str, outcomes: list[tuple[int, float, dict]]) -> None:
    times = sorted(t for _, t, _ in outcomes)
    print(f"\n{label}: {sum(s == 200 for s, _, _ in outcomes)}/{len(outcomes)} served, "
          f"{sum(s == 503 for s, _, _ in outcomes)} busy; answered in p50 {statistics.median(times) * 1000:.0f} ms, "
          f"p99 {times[int(len(times) * 0.99) - 1] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms")


@pytest.fixture
async def tenant_key(new_tenant):
    _, key = await new_tenant(requests_per_minute=100_000)
    return key


@pytest.mark.parametrize("via", ["redis", "sentinel"])
async def test_a_burst_far_above_the_pool_is_served(via, redis_server, adapter_store, tmp_path, tenant_key):
    if via == "sentinel":
        with sentinel_watching(redis_server, tmp_path) as port:
            url = f"redis+sentinel://127.0.0.1:{port}/fleet/0"
            await _served_through(url, redis_server.port, adapter_store, tmp_path, tenant_key, via)
    else:
        await _served_through(redis_server.url, redis_server.port, adapter_store, tmp_path, tenant_key, via)


def connections_to(pid: int, port: int) -> int:
    """The process's TCP connections to `port` (its Redis clients' pooled sockets)."""
    return sum(bool(c.raddr) and c.raddr.port == port for c in psutil.Process(pid).net_connections("tcp"))


async def _served_through(url: str, redis_port: int, voices, tmp_path, key: str, via: str) -> None:
    gateway = pooled_gateway(url, voices, tmp_path / "gateway", size=4, wait_s=10.0)
    try:
        outcomes = await burst(gateway.url, key)
        opened = connections_to(gateway.proc.pid, redis_port)  # a pool keeps what it opened
    finally:
        gateway.stop()
    report(f"{BURST} at once over a 4-connection pool ({via}); {opened} connections to Redis", outcomes)
    assert [s for s, _, _ in outcomes] == [200] * BURST, [e for s, _, e in outcomes if s != 200][:3]
    # the tenant client's 4, the ring store's 4 + 1 (its subscription), the training queue's 1
    assert opened <= 4 + 5 + 1, opened
    log = gateway.log_path.read_text()
    assert "unreachable" not in log and "MaxConnectionsError" not in log, gateway.log_tail()


async def test_a_wait_past_the_pool_s_bound_is_a_retryable_busy_never_unreachable(redis_server, adapter_store,
                                                                                   tmp_path, tenant_key):
    wait_s = 0.005
    gateway = pooled_gateway(redis_server.url, adapter_store, tmp_path / "gateway", size=1, wait_s=wait_s)
    try:
        outcomes = await burst(gateway.url, tenant_key)
        async with httpx.AsyncClient(timeout=30) as http:  # after the burst, the gateway serves as before
            after = await http.get(f"{gateway.url}/v1/usage", headers={"Authorization": f"Bearer {tenant_key}"})
    finally:
        gateway.stop()
    report(f"{BURST} at once over a 1-connection pool waiting {wait_s * 1000:g} ms", outcomes)
    statuses = {s for s, _, _ in outcomes}
    assert statuses <= {200, 503} and 503 in statuses, statuses
    assert after.status_code == 200
    for status, _, error in outcomes:
        if status == 503:
            assert error["code"] == "gateway_busy" and error["type"] == "service_unavailable", error
            assert "busy" in error["message"] and "unreachable" not in error["message"], error
            assert error["retry_after"] == "1"
    assert "unreachable" not in gateway.log_path.read_text(), gateway.log_tail()
