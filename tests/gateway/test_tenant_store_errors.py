"""Redis refusing commands for now is `Unavailable` (HTTP 503 + Retry-After), never a 400 with
Redis's own text (issue 19, M6). Against a real redis-server of this module's own, driven into
each state: memory full under noeviction (OOM), a replica cut off from its master (READONLY, and
MASTERDOWN when it may not serve stale data), a script that will not end (BUSY). The codes that
need a cluster or a loading server go through redis-py's own reply parser."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
import redis
import redis.exceptions
from redis._parsers.base import BaseParser

from gateway.api.errors import from_tenant_error
from gateway.tenants import StoreError, TenantError, TenantLimits, Tenants, Unavailable, connect_redis, redis_errors
from gateway.tenants.errors import REDIS_REFUSALS, refusal_code
from gateway.usage import Meter
from hashring.embedded import EmbeddedRedis

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server():
    with EmbeddedRedis() as embedded:
        yield embedded


@pytest.fixture
def admin(server):
    client = redis.Redis.from_url(server.url, decode_responses=True)
    yield client
    client.close()


def assert_unavailable(err: pytest.ExceptionInfo, *secrets: str) -> None:
    assert isinstance(err.value, Unavailable) and err.value.retryable, (secrets, err.value)
    answer = from_tenant_error(err.value)
    assert answer.status == 503 and answer.headers() == {"Retry-After": "1"}
    for secret in secrets[:-1] if len(secrets) > 2 else secrets:  # Redis's own words stay in the log
        assert secret not in answer.message


async def test_a_full_redis_under_noeviction_is_503_for_every_write(server, admin):
    client = connect_redis(server.url, timeout_s=2.0)
    prefix = f"test:oom:{uuid.uuid4().hex[:8]}"
    tenants, meter = Tenants(client, prefix), Meter(client, prefix)
    tenant, key = await tenants.create("acme")
    await tenants.register_voice(tenant, "v0", consent="yes")
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")  # below what Redis already uses: every write is refused
    try:
        writes = {
            "a new tenant (script)": lambda: tenants.create("other"),
            "a voice (script)": lambda: tenants.register_voice(tenant, "v1", consent="yes"),
            "a voice's state (script)": lambda: tenants.update_voice(tenant, "v0", note="x" * 1000),
            "usage (pipeline)": lambda: meter.add_usage(tenant, audio_seconds=1.0, requests=1),
        }
        for what, write in writes.items():
            with pytest.raises(TenantError) as err:
                await write()
            assert_unavailable(err, "maxmemory", "OOM", what)
        assert (await tenants.authenticate(key)).id == tenant.id  # reads still work
    finally:
        admin.config_set("maxmemory", "0")
        await client.aclose()


async def test_a_replica_cut_off_from_its_master_is_503(server, admin):
    client = connect_redis(server.url, timeout_s=2.0)
    tenants = Tenants(client, f"test:replica:{uuid.uuid4().hex[:8]}")
    tenant, key = await tenants.create("acme")
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a master that is not there
    try:
        with pytest.raises(TenantError) as err:  # READONLY You can't write against a read only replica.
            await tenants.register_voice(tenant, "v1", consent="yes")
        assert_unavailable(err, "replica")
        admin.config_set("replica-serve-stale-data", "no")
        with pytest.raises(TenantError) as err:  # MASTERDOWN Link with MASTER is down...
            await tenants.authenticate(key)
        assert_unavailable(err, "MASTER", "stale")
    finally:
        admin.config_set("replica-serve-stale-data", "yes")
        admin.execute_command("REPLICAOF", "NO", "ONE")
        await client.aclose()


async def test_a_script_that_will_not_end_makes_redis_busy_which_is_503(server, admin):
    admin.config_set("lua-time-limit", "50")
    client = connect_redis(server.url, timeout_s=2.0)
    tenants = Tenants(client, f"test:busy:{uuid.uuid4().hex[:8]}")
    tenant, key = await tenants.create("acme")
    spinner = redis.Redis.from_url(server.url, socket_timeout=30)
    spin = threading.Thread(target=lambda: pytest.raises(redis.exceptions.ResponseError, spinner.eval,
                                                         "while true do end", 0), daemon=True)
    spin.start()
    try:
        await asyncio.sleep(0.5)  # past lua-time-limit: Redis answers BUSY to everyone else
        with pytest.raises(TenantError) as err:
            await tenants.authenticate(key)
        assert_unavailable(err, "SCRIPT KILL")
    finally:
        for _ in range(50):
            try:
                admin.script_kill()
                break
            except redis.exceptions.ResponseError:
                await asyncio.sleep(0.1)
        spin.join(10)
        spinner.close()
        await client.aclose()


@pytest.mark.parametrize("reply", [
    "LOADING Redis is loading the dataset in memory",
    "NOREPLICAS Not enough good replicas to write.",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN The cluster is down",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "READONLY You can't write against a read only replica.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    # Redis 6 wraps an error raised inside a script
    "ERR Error running script (call to f_0123): @user_script:4: @user_script: 4: -OOM command not allowed",
])
def test_every_refusal_redis_py_parses_is_unavailable(reply):
    exc = BaseParser.parse_error(reply)
    assert refusal_code(exc) in REDIS_REFUSALS
    with pytest.raises(Unavailable) as err, redis_errors():
        raise exc
    assert reply.split(" ", 1)[1][:20] not in err.value.message


def test_a_refusal_that_will_not_pass_is_a_500_without_redis_s_text():
    exc = BaseParser.parse_error("WRONGTYPE Operation against a key holding the wrong kind of value")
    with pytest.raises(StoreError) as err, redis_errors():
        raise exc
    answer = from_tenant_error(err.value)
    assert answer.status == 500 and answer.type == "server_error" and "WRONGTYPE" not in answer.message
    assert "wrong kind" not in err.value.message and not err.value.retryable


def test_limits_records_still_validate():  # the package split kept TenantLimits' checks
    with pytest.raises(TenantError):
        TenantLimits(max_streams=0)


def test_a_caller_s_tenant_error_is_coded_without_the_gateway_s_class_names():
    from gateway.tenants import InvalidName

    answer = from_tenant_error(InvalidName("voice name 'a/b' is not usable"), param="name")
    assert (answer.status, answer.code, answer.param) == (400, "invalid_name", "name")
    assert "InvalidName" not in str(answer.body())
